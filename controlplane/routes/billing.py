"""GET /v1/billing/report: the caller's usage over [from, to), as JSON or CSV."""
from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping, Optional

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from controlplane.errors import ApiError
from controlplane.routes.api import ApiRoute, Operation, Param, scope, string_schema
from controlplane.routes.context import app_state, require
from controlplane.store import billing, tenants

PARAMS = {"from", "to", "group_by", "format", "tenant"}


async def report(request: Request) -> Response:
    principal = require(request, "billing:read")
    query = request.query_params
    check_params(query, PARAMS)
    group_by = group_of(query, billing.GROUPS, "day")
    fmt = format_of(query)
    window = window_of(query)
    if "tenant" in query and not principal.is_admin:
        raise ApiError(403, "tenant: only admin keys may query another tenant",
                       code="admin_required")
    async with app_state(request).sessions() as session:
        tenant_id = principal.tenant_id
        if "tenant" in query:
            tenant_id = (await tenants.find_tenant(session, query["tenant"])).id
        body = await billing.report(session, tenant_id, window, group_by)
    if fmt == "csv":
        return PlainTextResponse(to_csv(body), media_type="text/csv")
    return JSONResponse(body)


def check_params(query: Mapping[str, str], known: set[str]) -> None:
    unknown = sorted(set(query) - known)
    if unknown:
        raise ApiError(400, f"{unknown[0]}: unknown query parameter", param=unknown[0])


def group_of(query: Mapping[str, str], groups: tuple[str, ...], default: str) -> str:
    group_by = query.get("group_by", default)
    if group_by not in groups:
        raise ApiError(400, f"group_by: one of {', '.join(groups)}", param="group_by")
    return group_by


def format_of(query: Mapping[str, str]) -> str:
    fmt = query.get("format", "json")
    if fmt not in ("json", "csv"):
        raise ApiError(400, "format: json or csv", param="format")
    return fmt


def window_of(query: Mapping[str, str]) -> billing.Window:
    """[from, to): `to` now and `from` 30 days before it when absent, in UTC."""
    end = _time(query, "to") or datetime.now(timezone.utc)
    start = _time(query, "from") or _days_before(end, 30)
    if start >= end:
        raise ApiError(400, "from: must be before to", param="from")
    return billing.Window(start, end)


def to_csv(report_body: Mapping[str, Any]) -> str:
    """The report's rows, then a TOTAL line."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(billing.COLUMNS)
    for row in report_body["rows"]:
        writer.writerow([row[c] for c in billing.COLUMNS])
    writer.writerow(["TOTAL", *[report_body["totals"][c] for c in billing.COLUMNS[1:]]])
    return buffer.getvalue()


def _days_before(when: datetime, days: int) -> datetime:
    try:
        return when - timedelta(days=days)
    except OverflowError:
        raise ApiError(400, "to: too early for a default from; give from", param="to") from None


def _time(query: Mapping[str, str], name: str) -> Optional[datetime]:
    value = query.get(name)
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00").replace(" ", "+"))
        return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).astimezone(
            timezone.utc)
    except (ValueError, OverflowError):
        raise ApiError(400, f"{name}: must be an ISO 8601 date or time", param=name) from None


REPORT_QUERY = (
    Param("from", string_schema(format="date-time"), "window start (inclusive), UTC when naive"),
    Param("to", string_schema(format="date-time"), "window end (exclusive)"),
    Param("group_by", {"enum": list(billing.GROUPS)}),
    Param("format", {"enum": ["json", "csv"]}),
    Param("tenant", string_schema(), "admin keys only: another tenant's report"),
)
REPORT = {"type": "object", "required": ["rows", "totals", "gpu"], "properties": {
    "rows": {"type": "array", "items": {"type": "object"}}, "totals": {"type": "object"},
    "gpu": {"type": "object"}}}

routes = [ApiRoute("/v1/billing/report", report, "GET", Operation(
    "Usage and cost over [from, to), grouped", scope("billing:read"), query=REPORT_QUERY,
    response=REPORT))]
