"""What every route reads from its Request: the caller, its scopes, the JSON body."""
from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from controlplane.errors import ApiError
from controlplane.state import AppState, state_of
from controlplane.store.tenants import Principal


def app_state(request: Request) -> AppState:
    return state_of(request.app)


def request_id(request: Request) -> str:
    """Set by wire.request_id.RequestIdMiddleware before any route runs."""
    return str(request.state.request_id)


def require(request: Request, scope_name: str) -> Principal:
    """The caller, if its key holds `scope_name` (admin holds every scope)."""
    principal: Principal = request.state.principal
    if scope_name not in principal.scopes and not principal.is_admin:
        raise ApiError(403, f"this key lacks the {scope_name!r} scope", code="missing_scope")
    return principal


def require_admin(request: Request) -> Principal:
    principal: Principal = request.state.principal
    if not principal.is_admin:
        raise ApiError(403, "admin key required", code="admin_required")
    return principal


async def read_json(request: Request) -> Any:
    """The body as JSON: 413 past settings.max_body_bytes (even when the client does not
    declare a length), 400 when empty or not JSON."""
    max_bytes = app_state(request).settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw:
        raise ApiError(400, "body: a JSON object is required", param="body")
    try:
        return json.loads(raw)
    except ValueError as exc:
        message = f"invalid JSON ({exc.msg} at {exc.pos})" if isinstance(
            exc, json.JSONDecodeError) else "invalid JSON"
        raise ApiError(400, f"body: {message}", param="body") from None


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"body: larger than {max_bytes} bytes", code="body_too_large")
