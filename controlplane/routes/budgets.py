"""Spend budgets: GET/PUT /v1/budgets, GET/DELETE /v1/budgets/{id}.

Operators (admin keys) set tenant budgets, and any budget of any tenant (`tenant` in the
body, `?tenant=` to list one tenant's). A tenant (a key with `deploy`) sets budgets on
its own keys and deployments, tighter limits under the one the operator gave it, and
may not set, change or delete its tenant budget; it reads all of its budgets with
`billing:read`. Another tenant's budget is 404.
"""
from __future__ import annotations


from sqlalchemy.ext.asyncio import AsyncSession
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from controlplane.budgets.spec import parse_budget
from controlplane.errors import ApiError
from controlplane.lookups.service import Change
from controlplane.routes.api import ApiRoute, Operation, Param, data_of, scope
from controlplane.routes.context import app_state, read_json, require, tenant_in_query
from controlplane.store import budgets, tenants
from controlplane.store.tables import utcnow
from controlplane.store.tenants import Principal

OPERATOR_ONLY = "only the operator sets, changes or deletes a tenant budget"


async def list_budgets(request: Request) -> Response:
    principal = require(request, "billing:read")
    state, now = app_state(request), utcnow()
    async with state.sessions() as session:
        tenant = await tenant_in_query(session, request) if principal.is_admin else None
        owner = tenant.id if tenant is not None else (None if principal.is_admin else principal.tenant_id)
        found = await budgets.list_budgets(session, owner)
        views = [budgets.view(await budgets.standing(session, b, now)) for b in found]
    return JSONResponse({"data": views})


async def set_budget(request: Request) -> Response:
    """Create or replace the budget on the body's scope (one per tenant, key, deployment)."""
    principal = require(request, "deploy")
    spec = parse_budget(await read_json(request))
    if not principal.is_admin and spec.scope == "tenant":
        raise ApiError(403, f"scope: {OPERATOR_ONLY}", code="operator_only", param="scope")
    if not principal.is_admin and spec.tenant not in (None, principal.tenant_name):
        raise ApiError(403, "tenant: a tenant sets its own budgets only", code="operator_only",
                       param="tenant")
    state, now = app_state(request), utcnow()
    async with state.sessions.begin() as session:
        tenant_id = await _owner(session, principal, spec.tenant)
        target = await budgets.scope_id(session, tenant_id, spec)
        budget, created = await budgets.set_budget(session, tenant_id, spec, target, now)
        view = budgets.view(await budgets.standing(session, budget, now))
    await state.lookups.changed(Change("budgets", tenant_id))     # its calls read budgets now
    return JSONResponse(view, status_code=201 if created else 200)


async def _owner(session: AsyncSession, principal: Principal, tenant: str | None) -> str:
    """The tenant a budget is set for: the admin names it, a tenant is itself."""
    if not principal.is_admin:
        return principal.tenant_id
    if tenant is None:
        raise ApiError(422, "tenant: required (the tenant whose budget this is)", code="invalid_field",
                       param="tenant")
    return (await tenants.find_tenant(session, tenant)).id


async def get_budget(request: Request) -> Response:
    principal = require(request, "billing:read")
    state = app_state(request)
    async with state.sessions() as session:
        budget = await budgets.find_budget(session, request.path_params["id"], _visible_to(principal))
        view = budgets.view(await budgets.standing(session, budget, utcnow()))
    return JSONResponse(view)


async def delete_budget(request: Request) -> Response:
    principal = require(request, "deploy")
    state = app_state(request)
    async with state.sessions.begin() as session:
        budget = await budgets.find_budget(session, request.path_params["id"], _visible_to(principal))
        if budget.scope == "tenant" and not principal.is_admin:
            raise ApiError(403, OPERATOR_ONLY, code="operator_only")
        await budgets.delete_budget(session, budget)
    await state.lookups.changed(Change("budgets", budget.tenant_id))
    return Response(status_code=204)


def _visible_to(principal: Principal) -> str | None:
    return None if principal.is_admin else principal.tenant_id


MONEY = {"type": "string", "description": "a decimal amount, as the price book writes money"}
MONEY_IN = {"anyOf": [{"type": "string"}, {"type": "number", "minimum": 0}]}
BUDGET_BODY = {"type": "object", "required": ["scope", "limit"], "additionalProperties": False, "properties": {
    "scope": {"enum": ["tenant", "key", "deployment"]},
    "tenant": {"type": "string", "description": "admin: the tenant's name"},
    "key": {"type": "string", "description": "scope key: the key's id or prefix"},
    "deployment": {"type": "string", "description": "scope deployment: its name"},
    "limit": MONEY_IN, "period": {"enum": ["day", "month", "none"]},
    "time_zone": {"type": "string", "description": "an IANA time zone (default UTC)"},
    "soft_fraction": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "soft_amount": MONEY_IN}}
BUDGET = {"type": "object", "required": ["id", "scope", "scope_id", "limit", "period", "spent", "reserved",
                                         "remaining", "current_period"], "properties": {
    "id": {"type": "string"}, "tenant_id": {"type": "string"}, "scope": {"type": "string"},
    "scope_id": {"type": "string"}, "scope_name": {"type": ["string", "null"]}, "limit": MONEY,
    "period": {"type": "string"},
    "time_zone": {"type": "string"}, "soft_fraction": {"type": ["string", "null"]},
    "soft_amount": {"type": ["string", "null"]}, "spent": MONEY, "reserved": MONEY, "remaining": MONEY,
    "current_period": {"type": "object", "properties": {"start": {"type": "string"},
                                                         "end": {"type": ["string", "null"]}}},
    "alerts": {"type": "array", "items": {"type": "object"}}}}
READ, WRITE = scope("billing:read"), scope("deploy")

routes = [
    ApiRoute("/v1/budgets", list_budgets, "GET", Operation(
        "Budgets with their current period's spend (admin: every tenant's, or ?tenant=)", READ,
        query=(Param("tenant", {"type": "string"}, "admin: this tenant's budgets"),),
        response=data_of(BUDGET))),
    ApiRoute("/v1/budgets", set_budget, "PUT", Operation(
        "Set a budget on a tenant (admin), a key or a deployment", WRITE, body=BUDGET_BODY,
        response=BUDGET)),
    ApiRoute("/v1/budgets/{id}", get_budget, "GET", Operation(
        "One budget with its current period's spend and alerts", READ, response=BUDGET)),
    ApiRoute("/v1/budgets/{id}", delete_budget, "DELETE", Operation(
        "Delete a budget (admin only for a tenant budget)", WRITE, ok=204)),
]
