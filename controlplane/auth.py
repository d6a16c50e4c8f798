"""Bearer-key authentication as plain ASGI middleware (scope checks: routes.context)."""
from __future__ import annotations

from typing import Optional

from controlplane.errors import ApiError
from controlplane.state import state_of
from controlplane.store.tenants import principal_for
from wire.request_id import ASGIApp, Receive, Scope, Send

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


class AuthMiddleware:
    """Resolves `Authorization: Bearer <key>` to a Principal in scope["state"]."""

    def __init__(self, app: ASGIApp, public_paths: frozenset[str] = PUBLIC_PATHS):
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
        async with state_of(scope["app"]).sessions() as session:
            principal = await principal_for(session, secret)
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
