"""Bearer-key authentication as plain ASGI middleware, and scope checks."""
from __future__ import annotations

from starlette.requests import Request

from controlplane.errors import ApiError
from controlplane.tenants import Principal, principal_for

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


class AuthMiddleware:
    """Resolves `Authorization: Bearer <key>` to a Principal in scope["state"]."""

    def __init__(self, app, public_paths: frozenset[str] = PUBLIC_PATHS):
        self.app = app
        self.public_paths = public_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in self.public_paths:
            return await self.app(scope, receive, send)
        secret = _bearer(scope)
        if secret is None:
            return await ApiError(401, "missing bearer API key", code="missing_key").send_to(send)
        async with scope["app"].state.sessions() as session:
            principal = await principal_for(session, secret)
        if principal is None:
            return await ApiError(401, "invalid, expired or revoked API key",
                                  code="invalid_key").send_to(send)
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)


def _bearer(scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            kind, _, secret = value.decode("latin-1").partition(" ")
            if kind.lower() == "bearer" and secret.strip():
                return secret.strip()
    return None


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
