"""Tenant quotas: admins override a tenant's limits; a tenant reads its own and its usage."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from controlplane.fields import MAX_BIGINT, MAX_INT, obj, optional_integer
from controlplane.lookups.service import Change
from controlplane.quotas import LIMITS, MAX_EGRESS_HOSTS, egress_hosts
from controlplane.routes.api import ADMIN, ApiRoute, Operation, scope
from controlplane.routes.context import app_state, read_json, require, require_admin
from controlplane.settings import Settings
from controlplane.store import quotas, tenants, uploads
from controlplane.store.errors import InvalidField


async def get_for_tenant(request: Request) -> Response:
    require_admin(request)
    state = app_state(request)
    async with state.sessions() as session:
        tenant = await tenants.find_tenant(session, request.path_params["tenant"])
        body = await quota_view(session, tenant.id, state.settings)
    return JSONResponse(body)


async def set_for_tenant(request: Request) -> Response:
    """Given limits override the default; null gives a limit back to the default."""
    require_admin(request)
    state = app_state(request)
    body = obj("body", await read_json(request), set(LIMITS))
    changes = {name: _override(name, value) for name, value in body.items()}
    async with state.sessions.begin() as session:
        tenant = await tenants.find_tenant(session, request.path_params["tenant"])
        await quotas.set_overrides(session, tenant.id, changes)
        view = await quota_view(session, tenant.id, state.settings)
    await state.lookups.changed(Change("tenant_quotas", tenant.id))    # rate limits
    await state.pool.refresh()          # the pool enforces GPUs and queued requests
    return JSONResponse(view)


def _override(name: str, value: Any) -> Any:
    if name == "egress":
        try:
            return egress_hosts(value)
        except ValueError as exc:
            raise InvalidField("egress", str(exc)) from None
    return optional_integer(name, value, minimum=0, maximum=MAX_BIGINT if name == "max_upload_bytes" else MAX_INT)


async def mine(request: Request) -> Response:
    principal = require(request, "deploy")
    state = app_state(request)
    async with state.sessions() as session:
        view = await quota_view(session, principal.tenant_id, state.settings)
    return JSONResponse({k: v for k, v in view.items() if k != "overrides"})


async def quota_view(session: AsyncSession, tenant_id: str, settings: Settings) -> dict[str, Any]:
    overrides = await quotas.overrides_of(session, tenant_id)
    held = await quotas.holdings(session, tenant_id)
    used = await uploads.bytes_used(session, tenant_id, datetime.now(timezone.utc))
    return {"limits": settings.default_quota.with_overrides(overrides).as_dict(),
            "overrides": overrides,
            "usage": {"deployments": held.deployments, "reserved_gpus": held.reserved_gpus,
                      "upload_bytes": used}}


LIMITS_SCHEMA = {"type": "object", "properties": {
    **{name: {"type": ["integer", "null"], "minimum": 0} for name in LIMITS if name != "egress"},
    "egress": {"type": ["array", "null"], "items": {"type": "string", "description": "host:port"},
               "maxItems": MAX_EGRESS_HOSTS}}}
QUOTA = {"type": "object", "required": ["limits", "usage"],
         "properties": {"limits": LIMITS_SCHEMA, "usage": {"type": "object"}}}

routes = [
    ApiRoute("/v1/tenants/{tenant}/quota", get_for_tenant, "GET", Operation(
        "A tenant's quota: limits, overrides, usage", ADMIN, response=QUOTA)),
    ApiRoute("/v1/tenants/{tenant}/quota", set_for_tenant, "PATCH", Operation(
        "Override a tenant's limits (null: back to the default)", ADMIN,
        body={**LIMITS_SCHEMA, "additionalProperties": False}, response=QUOTA)),
    ApiRoute("/v1/quota", mine, "GET", Operation(
        "The caller's quota and what it holds", scope("deploy"), response=QUOTA)),
]
