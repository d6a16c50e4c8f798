"""Admin endpoints: tenants and their API keys (each key is shown once)."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Optional

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from controlplane.deployment_spec import NAME
from controlplane.errors import ApiError
from controlplane.keys import parse_scopes
from controlplane.models import ApiKey, Tenant
from controlplane.routes.context import app_state, read_json, require_admin
from controlplane.store import tenants
from controlplane.store.errors import InvalidField

KEY_FIELDS = {"scopes", "name", "expires_at", "requests_per_min", "tokens_per_min"}


async def create_tenant(request: Request) -> Response:
    require_admin(request)
    body = _object(await read_json(request), {"name"})
    name = body.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise InvalidField("name", "lowercase letters, digits and '-', 1-63 characters")
    async with app_state(request).sessions.begin() as session:
        tenant = await tenants.create_tenant(session, name)
    return JSONResponse(_tenant_view(tenant), status_code=201)


async def list_tenants(request: Request) -> Response:
    require_admin(request)
    async with app_state(request).sessions() as session:
        rows = await tenants.list_tenants(session)
    return JSONResponse({"data": [_tenant_view(t) for t in rows]})


async def create_key(request: Request) -> Response:
    require_admin(request)
    body = _object(await read_json(request), KEY_FIELDS)
    try:
        scopes = parse_scopes(body.get("scopes", ["invoke"]))
    except ValueError as exc:
        raise InvalidField("scopes", str(exc).partition(": ")[2]) from None
    requests_per_min = _limit(body, "requests_per_min")
    tokens_per_min = _limit(body, "tokens_per_min")
    name = body.get("name")
    if name is not None and not isinstance(name, str):
        raise InvalidField("name", "must be a string")
    expires_at = _expiry(body.get("expires_at"))
    async with app_state(request).sessions.begin() as session:
        tenant = await tenants.find_tenant(session, request.path_params["tenant"])
        key, new = await tenants.create_key(session, tenant, scopes, name=name,
                                            expires_at=expires_at,
                                            requests_per_min=requests_per_min,
                                            tokens_per_min=tokens_per_min)
    return JSONResponse({**_key_view(key), "key": new.secret}, status_code=201)


async def list_keys(request: Request) -> Response:
    require_admin(request)
    async with app_state(request).sessions() as session:
        tenant = await tenants.find_tenant(session, request.path_params["tenant"])
        keys = await tenants.list_keys(session, tenant)
    return JSONResponse({"data": [_key_view(k) for k in keys]})


async def revoke_key(request: Request) -> Response:
    require_admin(request)
    async with app_state(request).sessions.begin() as session:
        key = await tenants.revoke_key(session, request.path_params["prefix"])
    return JSONResponse(_key_view(key))


def _tenant_view(tenant: Tenant) -> dict[str, Any]:
    return {"id": tenant.id, "name": tenant.name, "created_at": tenant.created_at.isoformat()}


def _key_view(key: ApiKey) -> dict[str, Any]:
    return {"id": key.id, "prefix": key.prefix, "tenant_id": key.tenant_id,
            "scopes": list(key.scopes), "name": key.name,
            "requests_per_min": key.requests_per_min, "tokens_per_min": key.tokens_per_min,
            "expires_at": key.expires_at.isoformat() if key.expires_at else None,
            "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
            "created_at": key.created_at.isoformat()}


def _object(body: Any, allowed: set[str]) -> dict[str, Any]:
    """A JSON object of known fields: 400 otherwise, 422 naming the first unknown one."""
    if not isinstance(body, dict):
        raise ApiError(400, "body: must be a JSON object", param="body")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidField(unknown[0], "unknown field")
    return body


def _limit(body: dict[str, Any], name: str) -> Optional[int]:
    value = body.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InvalidField(name, "must be a positive integer")
    return value


def _expiry(value: Any) -> Optional[datetime]:
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise InvalidField("expires_at", "must be an ISO 8601 time") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


routes = [
    Route("/v1/tenants", create_tenant, methods=["POST"]),
    Route("/v1/tenants", list_tenants, methods=["GET"]),
    Route("/v1/tenants/{tenant}/keys", create_key, methods=["POST"]),
    Route("/v1/tenants/{tenant}/keys", list_keys, methods=["GET"]),
    Route("/v1/keys/{prefix}", revoke_key, methods=["DELETE"]),
]
