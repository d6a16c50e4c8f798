"""Tenants and their API keys (each key is shown once): admin endpoints, and a tenant's
own keys (list, revoke)."""
from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from controlplane.deploy.deployment_spec import NAME
from controlplane.fields import obj, optional_integer, text, timestamp
from controlplane.auth.keys import SCOPES, parse_scopes
from controlplane.auth.priorities import FIELDS as PRIORITY_FIELDS
from controlplane.auth.priorities import KeyPriorities
from controlplane.lookups.service import Change
from controlplane.store.tables import ApiKey, Tenant
from controlplane.routes.api import ADMIN, ApiRoute, Operation, data_of, scope, string_schema
from controlplane.routes.context import app_state, read_json, require, require_admin
from controlplane.store import tenants
from controlplane.store.errors import InvalidField
from wire.priority import HIGHEST, LOWEST

PRIORITY_DOCS = {
    "priority_min": "the most urgent priority the key's calls may ask for (lower runs first; default 0)",
    "priority_max": "the least urgent priority they may ask for (default: any)",
    "priority_default": "the priority of a call that names none (default 0, within the range)"}

KEY_FIELDS = {"scopes", "name", "expires_at", "requests_per_min", "tokens_per_min", *PRIORITY_FIELDS}


async def create_tenant(request: Request) -> Response:
    require_admin(request)
    body = obj("body", await read_json(request), {"name"})
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
    """A key of the tenant; the admin scope only on the operator's tenant (422 elsewhere).
    In memory before this answers: its first call reads nothing, even if its hash was
    remembered as unknown (controlplane.lookups.service)."""
    require_admin(request)
    state = app_state(request)
    body = obj("body", await read_json(request), KEY_FIELDS)
    try:
        scopes = parse_scopes(body.get("scopes", ["invoke"]))
    except ValueError as exc:
        raise InvalidField("scopes", str(exc).partition(": ")[2]) from None
    name = text("name", body["name"]) if body.get("name") is not None else None
    expires_at = (timestamp("expires_at", body["expires_at"])
                  if body.get("expires_at") is not None else None)
    requests_per_min = optional_integer("requests_per_min", body.get("requests_per_min"), 1)
    tokens_per_min = optional_integer("tokens_per_min", body.get("tokens_per_min"), 1)
    priorities = KeyPriorities(*(optional_integer(name, body.get(name), LOWEST, HIGHEST)
                                 for name in PRIORITY_FIELDS))
    async with state.sessions.begin() as session:
        tenant = await tenants.find_tenant(session, request.path_params["tenant"])
        key, new = await tenants.create_key(session, tenant, scopes, name=name,
                                            expires_at=expires_at,
                                            requests_per_min=requests_per_min,
                                            tokens_per_min=tokens_per_min, priorities=priorities)
    await state.lookups.changed(Change("api_keys", key.id))
    return JSONResponse({**_key_view(key), "key": new.secret}, status_code=201)


async def list_keys(request: Request) -> Response:
    require_admin(request)
    async with app_state(request).sessions() as session:
        tenant = await tenants.find_tenant(session, request.path_params["tenant"])
        keys = await tenants.list_keys(session, tenant.id)
    return JSONResponse({"data": [_key_view(k) for k in keys]})


async def my_keys(request: Request) -> Response:
    """The caller's tenant's keys (never a secret)."""
    principal = require(request, "deploy")
    async with app_state(request).sessions() as session:
        keys = await tenants.list_keys(session, principal.tenant_id)
    return JSONResponse({"data": [_key_view(k) for k in keys]})


async def revoke_key(request: Request) -> Response:
    """Refused from the moment this answers (every other control plane within a second).
    An admin revokes any key; a tenant's key with `deploy` those of its own tenant
    (another tenant's: 404, like anything of theirs)."""
    principal = require(request, "deploy")
    state = app_state(request)
    async with state.sessions.begin() as session:
        key = await tenants.revoke_key(session, request.path_params["prefix"],
                                       None if principal.is_admin else principal.tenant_id)
    await state.lookups.changed(Change("api_keys", key.id))
    return JSONResponse(_key_view(key))


def _tenant_view(tenant: Tenant) -> dict[str, Any]:
    return {"id": tenant.id, "name": tenant.name, "created_at": tenant.created_at.isoformat()}


def _key_view(key: ApiKey) -> dict[str, Any]:
    return {"id": key.id, "prefix": key.prefix, "tenant_id": key.tenant_id,
            "scopes": list(key.scopes), "name": key.name,
            "requests_per_min": key.requests_per_min, "tokens_per_min": key.tokens_per_min,
            **tenants.key_priorities(key).view(),
            "expires_at": key.expires_at.isoformat() if key.expires_at else None,
            "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
            "created_at": key.created_at.isoformat()}


TENANT = {"type": "object", "required": ["id", "name", "created_at"],
          "properties": {"id": {"type": "string"}, "name": {"type": "string"},
                         "created_at": {"type": "string"}}}
KEY = {"type": "object", "required": ["id", "prefix", "tenant_id", "scopes"],
       "properties": {"id": {"type": "string"}, "prefix": {"type": "string"},
                      "tenant_id": {"type": "string"},
                      "scopes": {"type": "array", "items": {"type": "string"}},
                      "key": {"type": "string", "description": "the secret, shown once"}}}
KEY_BODY = {"type": "object", "additionalProperties": False, "properties": {
    "scopes": {"type": "array", "items": {"enum": sorted(SCOPES)}},
    "name": {"type": "string"}, "expires_at": string_schema(format="date-time"),
    "requests_per_min": {"type": "integer", "minimum": 1},
    "tokens_per_min": {"type": "integer", "minimum": 1},
    **{name: {"type": "integer", "minimum": LOWEST, "maximum": HIGHEST,
              "description": PRIORITY_DOCS[name]} for name in PRIORITY_FIELDS}}}

routes = [
    ApiRoute("/v1/tenants", create_tenant, "POST", Operation(
        "Create a tenant", ADMIN, ok=201, response=TENANT,
        body={"type": "object", "required": ["name"], "additionalProperties": False,
              "properties": {"name": string_schema(NAME.pattern)}})),
    ApiRoute("/v1/tenants", list_tenants, "GET", Operation(
        "List tenants", ADMIN, response=data_of(TENANT))),
    ApiRoute("/v1/tenants/{tenant}/keys", create_key, "POST", Operation(
        "Create an API key for a tenant (the secret is shown once)", ADMIN, ok=201,
        body=KEY_BODY, response=KEY)),
    ApiRoute("/v1/tenants/{tenant}/keys", list_keys, "GET", Operation(
        "List a tenant's API keys", ADMIN, response=data_of(KEY))),
    ApiRoute("/v1/keys", my_keys, "GET", Operation(
        "List the caller's tenant's API keys", scope("deploy"), response=data_of(KEY))),
    ApiRoute("/v1/keys/{prefix}", revoke_key, "DELETE", Operation(
        "Revoke an API key (admin: any; a tenant: its own)", scope("deploy"), response=KEY)),
]
