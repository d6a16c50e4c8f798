"""What every route reads from its Request: the caller, its scopes, the JSON body."""
from __future__ import annotations

from typing import Any, Optional

from sqlalchemy.ext.asyncio import AsyncSession

from starlette.requests import ClientDisconnect, Request

from controlplane.errors import ApiError
from controlplane.state import AppState, state_of
from controlplane.store.tables import Tenant
from controlplane.store.tenants import Principal, find_tenant
from wire.json_input import parse_json


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


async def tenant_in_query(session: AsyncSession, request: Request) -> Optional[Tenant]:
    """The tenant `?tenant=` names (404 if none has that name), or None without one."""
    name = request.query_params.get("tenant")
    return None if name is None else await find_tenant(session, name)


def require_admin(request: Request) -> Principal:
    principal: Principal = request.state.principal
    if not principal.is_admin:
        raise ApiError(403, "admin key required", code="admin_required")
    return principal


async def read_json(request: Request) -> Any:
    """The body as JSON: 413 past settings.max_body_bytes (even when the client does not
    declare a length), 400 when empty, not JSON or nested too deep (wire.json_input)."""
    raw = await read_body(request, app_state(request).settings.max_body_bytes)
    if not raw:
        raise ApiError(400, "body: a JSON object is required", param="body")
    return parse_json(raw, "body", param="body")


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The body straight from ASGI's receive (Starlette's stream is an async generator
    over the same messages, and its headers an object built per request, a cost on every
    call); ClientDisconnect when the client left, 413 past `max_bytes`."""
    for name, value in request.scope["headers"]:
        if name == b"content-length":
            if value.isdigit() and int(value) > max_bytes:
                raise _too_large(max_bytes)
            break
    chunks, size = [], 0
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"body: larger than {max_bytes} bytes", code="body_too_large")
