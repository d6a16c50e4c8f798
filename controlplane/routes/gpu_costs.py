"""The operator's cost book (admin only): what one GPU-second of each GPU kind costs the
platform. A tenant never reads it: its prices are the price book's.

`POST /v1/gpu-costs {"gpu_kind": "cuda", "per_gpu_second": "0.0011", "effective_from": ...}`
adds a row (no `gpu_kind`: the default, for every kind without a row of its own);
`effective_from` is now when absent and never in the past. `GET` lists the book, with
what is in effect now per kind; `DELETE /v1/gpu-costs/{id}` only before the row takes
effect (409 `cost_in_effect`).
"""
from __future__ import annotations

import re
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, Optional

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from controlplane.billing.costs import cost_at, for_kind
from controlplane.billing.pricing import PRICE_QUANTUM, parse_price
from controlplane.fields import effective_from, obj, text
from controlplane.routes.api import ADMIN, ApiRoute, Operation, data_of, string_schema
from controlplane.routes.context import app_state, read_json, require_admin
from controlplane.store import gpu_costs
from controlplane.store.errors import InvalidField
from controlplane.store.tables import GpuCost

KIND = r"^[a-z0-9][a-z0-9_.-]{0,31}$"        # a slot kind as the pool's inventory names it


async def add(request: Request) -> Response:
    require_admin(request)
    body = obj("body", await read_json(request), {"gpu_kind", "per_gpu_second", "effective_from"})
    kind, per_second = _kind(body.get("gpu_kind")), _cost(body)
    starts = effective_from(body, datetime.now(timezone.utc), "a margin already reported is never recomputed")
    async with app_state(request).sessions.begin() as session:
        row = await gpu_costs.add(session, kind, per_second, starts)
    return JSONResponse(row_view(row), status_code=201)


async def list_book(request: Request) -> Response:
    """The rows, and per kind named in the book (and the default) the cost in effect now."""
    require_admin(request)
    async with app_state(request).sessions() as session:
        rows = await gpu_costs.book(session)
    now, book = datetime.now(timezone.utc), [gpu_costs.cost_row(r) for r in rows]
    kinds = sorted({r.gpu_kind for r in book if r.gpu_kind is not None})
    in_effect = {}
    for kind in [None, *kinds]:
        found = cost_at(for_kind(book, kind), now)
        in_effect[kind or "(default)"] = None if found is None else _money(found.per_gpu_second)
    return JSONResponse({"data": [row_view(r) for r in rows], "in_effect": in_effect})


async def delete(request: Request) -> Response:
    require_admin(request)
    async with app_state(request).sessions.begin() as session:
        await gpu_costs.delete_scheduled(session, request.path_params["id"],
                                         datetime.now(timezone.utc))
    return Response(status_code=204)


def _kind(value: Any) -> Optional[str]:
    if value is None:
        return None
    kind = text("gpu_kind", value, max_length=32)
    if not re.fullmatch(KIND, kind):
        raise InvalidField("gpu_kind", "a slot kind: lowercase letters, digits, '.', '_' or "
                                       "'-' (the pool's are cuda and cpu)")
    return kind


def _cost(body: dict[str, Any]) -> Decimal:
    if "per_gpu_second" not in body:
        raise InvalidField("per_gpu_second", "is required")
    try:
        return parse_price("per_gpu_second", body["per_gpu_second"])
    except ValueError as exc:
        raise InvalidField("per_gpu_second", str(exc).partition(": ")[2]) from None


def row_view(row: GpuCost) -> dict[str, Any]:
    return {"id": row.id, "gpu_kind": row.gpu_kind, "per_gpu_second": _money(row.per_gpu_second),
            "effective_from": row.effective_from.isoformat(),
            "created_at": row.created_at.isoformat()}


def _money(value: Decimal) -> str:
    return format(value.quantize(PRICE_QUANTUM), "f")


COST = {"anyOf": [{"type": "string", "pattern": r"^\d{1,9}(\.\d{1,9})?$"},
                  {"type": "number", "minimum": 0}]}
ROW_BODY = {"type": "object", "required": ["per_gpu_second"], "additionalProperties": False,
            "properties": {"gpu_kind": {"type": ["string", "null"], "pattern": KIND},
                           "per_gpu_second": COST,
                           "effective_from": string_schema(format="date-time")}}
ROW = {"type": "object", "required": ["id", "gpu_kind", "per_gpu_second", "effective_from"],
       "properties": {"id": {"type": "string"}, "gpu_kind": {"type": ["string", "null"]},
                      "per_gpu_second": {"type": "string"}}}
BOOK = {"type": "object", "required": ["data", "in_effect"],
        "properties": {**data_of(ROW)["properties"], "in_effect": {"type": "object"}}}

routes = [
    ApiRoute("/v1/gpu-costs", add, "POST", Operation(
        "Add a GPU-second cost: one GPU kind's, or the default", ADMIN, ok=201,
        body=ROW_BODY, response=ROW)),
    ApiRoute("/v1/gpu-costs", list_book, "GET", Operation(
        "The cost book, and the cost in effect now per kind", ADMIN, response=BOOK)),
    ApiRoute("/v1/gpu-costs/{id}", delete, "DELETE", Operation(
        "Delete a cost row that is not yet in effect", ADMIN, ok=204)),
]
