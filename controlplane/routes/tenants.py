"""Admin endpoints: tenants and their API keys (each key is shown once)."""
from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import select
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from controlplane import tenants as tenants_db
from controlplane.auth import require_admin
from controlplane.bodies import read_json
from controlplane.deployment_spec import NAME
from controlplane.errors import ApiError, invalid
from controlplane.keys import parse_scopes
from controlplane.models import ApiKey, Tenant

KEY_FIELDS = {"scopes", "name", "expires_at", "requests_per_min", "tokens_per_min"}


async def create_tenant(request: Request) -> Response:
    require_admin(request)
    body = await read_json(request, request.app.state.settings.max_body_bytes)
    if not isinstance(body, dict) or set(body) - {"name"}:
        raise invalid(_first_unknown(body, {"name"}), "unknown field")
    name = body.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise invalid("name", "lowercase letters, digits and '-', 1-63 characters")
    async with request.app.state.sessions() as session, session.begin():
        tenant = await tenants_db.create_tenant(session, name)
    return JSONResponse(_tenant_view(tenant), status_code=201)


async def list_tenants(request: Request) -> Response:
    require_admin(request)
    async with request.app.state.sessions() as session:
        rows = await session.scalars(select(Tenant).order_by(Tenant.name))
        return JSONResponse({"data": [_tenant_view(t) for t in rows]})


async def create_key(request: Request) -> Response:
    require_admin(request)
    body = await read_json(request, request.app.state.settings.max_body_bytes)
    if not isinstance(body, dict) or set(body) - KEY_FIELDS:
        raise invalid(_first_unknown(body, KEY_FIELDS), "unknown field")
    try:
        scopes = parse_scopes(body.get("scopes", ["invoke"]))
    except ValueError as exc:
        raise invalid("scopes", str(exc).partition(": ")[2]) from None
    limits = {name: _limit(body, name) for name in ("requests_per_min", "tokens_per_min")}
    name = body.get("name")
    if name is not None and not isinstance(name, str):
        raise invalid("name", "must be a string")
    async with request.app.state.sessions() as session, session.begin():
        tenant = await tenants_db.find_tenant(session, request.path_params["tenant"])
        key, new = await tenants_db.create_key(session, tenant, scopes, name=name,
                                               expires_at=_expiry(body.get("expires_at")),
                                               **limits)
    return JSONResponse({**tenants_db.key_view(key), "key": new.secret}, status_code=201)


async def list_keys(request: Request) -> Response:
    require_admin(request)
    async with request.app.state.sessions() as session:
        tenant = await tenants_db.find_tenant(session, request.path_params["tenant"])
        rows = await session.scalars(select(ApiKey).where(ApiKey.tenant_id == tenant.id)
                                     .order_by(ApiKey.created_at))
        return JSONResponse({"data": [tenants_db.key_view(k) for k in rows]})


async def revoke_key(request: Request) -> Response:
    require_admin(request)
    async with request.app.state.sessions() as session, session.begin():
        key = await tenants_db.revoke_key(session, request.path_params["prefix"])
        return JSONResponse(tenants_db.key_view(key))


def _tenant_view(tenant: Tenant) -> dict:
    return {"id": tenant.id, "name": tenant.name, "created_at": tenant.created_at.isoformat()}


def _limit(body: dict, name: str):
    value = body.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise invalid(name, "must be a positive integer")
    return value


def _expiry(value):
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise invalid("expires_at", "must be an ISO 8601 time") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _first_unknown(body, allowed: set) -> str:
    if not isinstance(body, dict):
        raise ApiError(400, "body: must be a JSON object", param="body")
    return sorted(set(body) - allowed)[0]


routes = [
    Route("/v1/tenants", create_tenant, methods=["POST"]),
    Route("/v1/tenants", list_tenants, methods=["GET"]),
    Route("/v1/tenants/{tenant}/keys", create_key, methods=["POST"]),
    Route("/v1/tenants/{tenant}/keys", list_keys, methods=["GET"]),
    Route("/v1/keys/{prefix}", revoke_key, methods=["DELETE"]),
]
