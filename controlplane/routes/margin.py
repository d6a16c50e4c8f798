"""GET /v1/billing/margin: every tenant's revenue against what serving it cost the
platform, over [from, to), by deployment or by tenant, as JSON or CSV (admin only: a
tenant never sees the platform's costs). The figures are controlplane.billing.margin's;
docs/margin.md defines each."""
from __future__ import annotations

import csv
import io
from typing import Any, Mapping

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from controlplane.routes.api import ADMIN, ApiRoute, Operation, Param
from controlplane.routes.billing import (REPORT_QUERY, check_params, format_of, group_of,
                                         window_of)
from controlplane.routes.context import app_state, require_admin
from controlplane.store import margin

PARAMS = {"from", "to", "group_by", "format"}
COLUMNS = ("key", "tenant", "deployment", "requests", "prompt_tokens", "cached_tokens",
           "completion_tokens", "tokens", "token_revenue", "gpu_revenue", "revenue", "gpu_cost",
           "margin", "margin_pct", "gpu_seconds", "idle_gpu_seconds", "idle_share",
           "asleep_gpu_seconds", "sleep_share", "cost_per_1k_tokens", "cache_hit_rate",
           "mean_batch_size", "quantization", "gpu_kinds")


async def report(request: Request) -> Response:
    require_admin(request)
    query = request.query_params
    check_params(query, PARAMS)
    group_by = group_of(query, margin.GROUPS, "deployment")
    fmt, window = format_of(query), window_of(query)
    async with app_state(request).sessions() as session:
        body = await margin.report(session, window, group_by)
    if fmt == "csv":
        return PlainTextResponse(to_csv(body), media_type="text/csv")
    return JSONResponse(body)


def to_csv(body: Mapping[str, Any]) -> str:
    """The rows, then a TOTAL line; lists (quantization, GPU kinds) joined with '+'."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    totals = {"key": "TOTAL", "tenant": None, "deployment": None, **body["totals"]}
    for row in [*body["rows"], totals]:
        writer.writerow([_cell(row[c]) for c in COLUMNS])
    return buffer.getvalue()


def _cell(value: Any) -> Any:
    if isinstance(value, list):
        return "+".join(value)
    return "" if value is None else value


MARGIN_QUERY = (*[p for p in REPORT_QUERY if p.name in ("from", "to", "format")],
                Param("group_by", {"enum": list(margin.GROUPS)}))
MARGIN = {"type": "object", "required": ["rows", "totals", "group_by"], "properties": {
    "rows": {"type": "array", "items": {"type": "object", "required": list(COLUMNS)}},
    "totals": {"type": "object"}}}

routes = [ApiRoute("/v1/billing/margin", report, "GET", Operation(
    "Revenue, GPU cost and margin over [from, to), by deployment or tenant, with what "
    "drives the cost", ADMIN, query=MARGIN_QUERY, response=MARGIN))]
