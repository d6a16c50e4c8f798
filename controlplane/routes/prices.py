"""The operator's price book (admin) and the prices that apply to a tenant (its own view).

One design for every price: rows in the book, by scope. An admin adds the
default, a tenant's plan (`tenant`), a deployment's override (`tenant` and
`deployment`) or an adapter's price (`tenant` and `adapter`: the row names the
adapter's base too, which `deployment` may repeat), each in effect from
`effective_from` (now when absent; never in the past), and may delete a row only
before it takes effect. A row's `tier` says what it prices: interactive calls (the
default) or batch lines (controlplane.batch.pricing). Deploy bodies carry no prices (403 `pricing`).
"""
from __future__ import annotations

from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any, Optional

from sqlalchemy.ext.asyncio import AsyncSession
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from controlplane.errors import ApiError
from controlplane.fields import effective_from, obj, text
from controlplane.lookups.service import Change
from controlplane.billing.pricing import (INTERACTIVE, PRICE_FIELDS, PRICE_QUANTUM, TIERS, PriceRow, Pricing,
                                         parse_price, price_at)
from controlplane.routes.api import ADMIN, ApiRoute, Operation, Param, data_of, scope, string_schema
from controlplane.routes.context import (app_state, read_json, require, require_admin,
                                         tenant_in_query)
from controlplane.store import adapters, deployments, prices, tenants
from controlplane.store.errors import InvalidField
from controlplane.store.prices import BookRow
from controlplane.store.tables import Deployment, Tenant

REQUIRED_PRICES = ("input_per_mtok", "output_per_mtok")
SCOPE_NAMES = ("default", "plan", "deployment", "adapter")     # by PriceScope


async def add(request: Request) -> Response:
    require_admin(request)
    body = obj("body", await read_json(request), {*PRICE_FIELDS, "tenant", "deployment",
                                                  "adapter", "effective_from", "tier"})
    pricing, tier = parse_pricing(body), _tier(body)
    starts = effective_from(body, datetime.now(timezone.utc), "usage already priced is never repriced")
    async with app_state(request).sessions.begin() as session:
        tenant = None
        if body.get("tenant") is not None:
            tenant = await tenants.find_tenant(session, text("tenant", body["tenant"]))
        if body.get("adapter") is not None:
            adapter = await _adapter(session, tenant, body)
            row = await prices.add(session, pricing, starts, tenant, adapter=adapter, tier=tier)
        else:
            deployment = await _deployment(session, tenant, body)
            row = await prices.add(session, pricing, starts, tenant, deployment, tier=tier)
    await app_state(request).lookups.changed(Change("prices", row.row.id))
    return JSONResponse(book_view(row), status_code=201)


def _tier(body: dict[str, Any]) -> str:
    """Which calls the row prices: interactive ones (the default) or batch lines."""
    tier = body.get("tier", INTERACTIVE)
    if tier not in TIERS:
        raise InvalidField("tier", f"must be one of {', '.join(TIERS)}")
    return str(tier)


async def _deployment(session: AsyncSession, tenant: Optional[Tenant],
                      body: dict[str, Any]) -> Optional[Deployment]:
    if body.get("deployment") is None:
        return None
    if tenant is None:
        raise InvalidField("deployment", "needs the tenant it belongs to")
    return await deployments.find(session, tenant.id, text("deployment", body["deployment"]))


async def _adapter(session: AsyncSession, tenant: Optional[Tenant],
                   body: dict[str, Any]) -> adapters.Attached:
    """The tenant's adapter (404 `adapter_not_found`); a `deployment` given with it must
    name the adapter's base (400: a row names one base, the one the adapter runs on)."""
    if tenant is None:
        raise InvalidField("adapter", "needs the tenant it belongs to")
    adapter, base = attached = await adapters.find(session, tenant.id, text("adapter", body["adapter"]))
    named = body.get("deployment")
    if named is not None and text("deployment", named) != base.name:
        raise ApiError(400, f"deployment: adapter {adapter.name!r} runs on {base.name!r}, not {named!r}",
                       code="adapter_base_mismatch", param="deployment")
    return attached


async def list_book(request: Request) -> Response:
    require_admin(request)
    async with app_state(request).sessions() as session:
        rows = await prices.book(session, await tenant_in_query(session, request))
    return JSONResponse({"data": [book_view(r) for r in rows]})


async def delete(request: Request) -> Response:
    """Only a row not yet in effect (409 `price_in_effect` otherwise)."""
    require_admin(request)
    async with app_state(request).sessions.begin() as session:
        await prices.delete_scheduled(session, request.path_params["id"],
                                      datetime.now(timezone.utc))
    await app_state(request).lookups.changed(Change("prices", request.path_params["id"]))
    return Response(status_code=204)


async def mine(request: Request) -> Response:
    """The caller's prices now (its plan or the default, each deployment's and each
    adapter's), and the changes scheduled that will apply to it."""
    principal = require(request, "billing:read")
    now = datetime.now(timezone.utc)
    async with app_state(request).sessions() as session:
        rows = await prices.rows_for_tenant(session, principal.tenant_id)
        names = await deployments.names_of(session, principal.tenant_id)
        attached = await adapters.list_for(session, principal.tenant_id)
    bases = {**{base.id: base.name for _, base in attached}, **names}
    adapter_names = {a.id: a.name for a, _ in attached}
    mine_rows = [r for r in rows if (r.deployment_id is None or r.deployment_id in bases)
                 and (r.adapter_id is None or r.adapter_id in adapter_names)]
    plan = [prices.price_row(r) for r in mine_rows if r.deployment_id is None and r.tier == INTERACTIVE]

    def now_of(deployment_id: str, adapter_id: Optional[str] = None) -> dict[str, Any]:
        return _in_effect(price_at(prices.applicable(rows, deployment_id, adapter_id), now))
    return JSONResponse({
        "plan": _in_effect(price_at(plan, now)),
        "deployments": [{"name": name, **now_of(d)}
                        for d, name in sorted(names.items(), key=lambda item: item[1])],
        "adapters": [{"name": a.name, "deployment": base.name,
                      **now_of(base.id, a.id)} for a, base in attached],
        "scheduled": [{**_in_effect(prices.price_row(r)), "tier": r.tier, "deployment": bases.get(
            r.deployment_id or ""), "adapter": adapter_names.get(r.adapter_id or "")}
            for r in mine_rows if r.effective_from > now]})


def parse_pricing(body: dict[str, Any]) -> Pricing:
    """Input and output prices are required; cached input defaults to input, the rest to 0."""
    for name in REQUIRED_PRICES:
        if name not in body:
            raise InvalidField(name, "is required")
    values = {}
    for name in PRICE_FIELDS:
        if name in body:
            try:
                values[name] = parse_price(name, body[name])
            except ValueError as exc:
                raise InvalidField(name, str(exc).partition(": ")[2]) from None
    values.setdefault("cached_input_per_mtok", values["input_per_mtok"])
    return Pricing(**values)


def book_view(book_row: BookRow) -> dict[str, Any]:
    row = book_row.row
    return {"id": row.id, **_in_effect(book_row.price), "tier": row.tier, "tenant": book_row.tenant_name,
            "deployment": book_row.deployment_name, "adapter": book_row.adapter_name,
            "created_at": row.created_at.isoformat()}


def _in_effect(row: Optional[PriceRow]) -> dict[str, Any]:
    if row is None:
        return {"scope": None, "effective_from": None, "prices": _prices_view(Pricing())}
    return {"scope": SCOPE_NAMES[row.scope], "effective_from": row.effective_from.isoformat(),
            "prices": _prices_view(row.pricing)}


def _prices_view(pricing: Pricing) -> dict[str, str]:
    return {name: format(value.quantize(PRICE_QUANTUM), "f") for name, value in asdict(pricing).items()}


PRICE = {"anyOf": [{"type": "string", "pattern": r"^\d{1,9}(\.\d{1,9})?$"},
                   {"type": "number", "minimum": 0}]}
ROW_BODY = {"type": "object", "required": list(REQUIRED_PRICES), "additionalProperties": False,
            "properties": {**{name: PRICE for name in PRICE_FIELDS},
                           "tenant": {"type": "string"}, "deployment": {"type": "string"},
                           "adapter": {"type": "string"}, "tier": {"enum": list(TIERS)},
                           "effective_from": string_schema(format="date-time")}}
IN_EFFECT = {"type": "object", "required": ["scope", "effective_from", "prices"],
             "properties": {"scope": {"enum": [*SCOPE_NAMES, None]},
                            "prices": {"type": "object"}}}
ROW = {"type": "object", "required": ["id", "scope", "prices", "effective_from"],
       "properties": {"id": {"type": "string"}, "scope": {"enum": list(SCOPE_NAMES)}}}

routes = [
    ApiRoute("/v1/price-book", add, "POST", Operation(
        "Add a price: the default, a tenant's plan, a deployment's override or an adapter's",
        ADMIN, ok=201,
        body=ROW_BODY, response=ROW)),
    ApiRoute("/v1/price-book", list_book, "GET", Operation(
        "The price book", ADMIN, query=(Param("tenant", string_schema()),),
        response=data_of(ROW))),
    ApiRoute("/v1/price-book/{id}", delete, "DELETE", Operation(
        "Delete a price row that is not yet in effect", ADMIN, ok=204)),
    ApiRoute("/v1/billing/prices", mine, "GET", Operation(
        "The prices that apply to the caller, now and scheduled", scope("billing:read"),
        response={"type": "object", "required": ["plan", "deployments", "adapters", "scheduled"],
                  "properties": {"plan": IN_EFFECT}})),
]
