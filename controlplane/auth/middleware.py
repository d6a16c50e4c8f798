"""Bearer-key authentication as plain ASGI middleware (scope checks: routes.context)."""
from __future__ import annotations

from typing import Optional

from controlplane.errors import ApiError, api_error_for
from controlplane.state import state_of
from controlplane.store.errors import DatabaseUnavailable
from wire.request_id import ASGIApp, Receive, Scope, Send

class AuthMiddleware:
    """Resolves `Authorization: Bearer <key>` to a Principal in scope["state"] (from the
    in-memory copy of the keys, controlplane.lookups.service; 503 with Retry-After for a key it
    does not hold while Postgres is away), except on
    `public_paths` (create_app passes those of the routes documented as needing no key:
    health, the OpenAPI document, and /metrics, which checks the metrics token itself)."""

    def __init__(self, app: ASGIApp, public_paths: frozenset[str]):
        self.app = app
        self.public_paths = public_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.public_paths:
            await self.app(scope, receive, send)
            return
        secret = _bearer(scope)
        if secret is None:
            await ApiError(401, "missing bearer API key", code="missing_key").send_to(send)
            return
        try:
            principal = await state_of(scope["app"]).lookups.principal(secret)   # from memory
        except DatabaseUnavailable as exc:       # a key memory does not hold, Postgres away
            await api_error_for(exc).send_to(send)
            return
        if principal is None:
            await ApiError(401, "invalid, expired or revoked API key",
                           code="invalid_key").send_to(send)
            return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)


def _bearer(scope: Scope) -> Optional[str]:
    for name, value in scope["headers"]:
        if name == b"authorization":
            kind, _, secret = value.decode("latin-1").partition(" ")
            if kind.lower() == "bearer" and secret.strip():
                return str(secret.strip())
    return None
