"""The web console's two reads beyond the public API (work: controlplane.store.activity,
controlplane.store.billing); the page itself is served by controlplane.console.

Both answer for the caller's tenant only, like every tenant route: a deployment of
another tenant is simply not found.
"""
from __future__ import annotations

from datetime import date, datetime, time, timedelta, timezone
from typing import Any, Optional

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from controlplane.errors import ApiError
from controlplane.billing.lifetimes import Window
from controlplane.routes.api import ApiRoute, Operation, Param, scope, string_schema
from controlplane.routes.context import app_state, require
from controlplane.store import activity, billing, deployments

ACTIVITY_WINDOW = timedelta(hours=1)
MAX_DAYS = 92
SERIES = ("requests", "prompt_tokens", "completion_tokens", "token_cost", "gpu_seconds",
          "gpu_cost", "cost")


async def deployment_activity(request: Request) -> Response:
    """Per-minute requests, tokens and TTFT over the last hour, and the recent thaws."""
    principal = require(request, "deploy")
    since = datetime.now(timezone.utc) - ACTIVITY_WINDOW
    async with app_state(request).sessions() as session:
        deployment = await deployments.find(session, principal.tenant_id,
                                            request.path_params["name"])
        per_minute = await activity.minutes(session, principal.tenant_id, deployment.id, since)
        thaws = await activity.thaws(session, principal.tenant_id, deployment.id)
    return JSONResponse({
        "since": since.isoformat(), "thaws": thaws,
        "minutes": [{"at": m.at.isoformat(), "requests": m.requests, "tokens": m.tokens,
                     "ttft_s": m.ttft_s} for m in per_minute]})


async def daily_usage(request: Request) -> Response:
    """The billing report of each UTC day in [from, to), by deployment: the usage page's
    stacked charts, each day's numbers the report API's for that day."""
    principal = require(request, "billing:read")
    first, end = _days(request.query_params.get("from"), request.query_params.get("to"))
    days = [first + timedelta(days=n) for n in range((end - first).days)]
    series: dict[str, dict[str, list[Any]]] = {}
    async with app_state(request).sessions() as session:
        for n, day in enumerate(days):
            start = datetime.combine(day, time(), timezone.utc)
            report = await billing.report(session, principal.tenant_id,
                                          Window(start, start + timedelta(days=1)), "deployment")
            for row in report["rows"]:
                per = series.setdefault(row["key"], {c: [0] * len(days) for c in SERIES})
                for column in SERIES:
                    per[column][n] = row[column]
    return JSONResponse({"days": [d.isoformat() for d in days], "deployments": series})


def _days(given_from: Optional[str], given_to: Optional[str]) -> tuple[date, date]:
    """[from, to) in whole UTC days: to defaults to tomorrow, from to 30 days before to."""
    end = _date("to", given_to) or datetime.now(timezone.utc).date() + timedelta(days=1)
    first = _date("from", given_from) or end - timedelta(days=30)
    if not first < end or (end - first).days > MAX_DAYS:
        raise ApiError(400, f"from: must be before to, at most {MAX_DAYS} days", param="from")
    return first, end


def _date(name: str, value: Optional[str]) -> Optional[date]:
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise ApiError(400, f"{name}: a date, YYYY-MM-DD", param=name) from None


ACTIVITY = {"type": "object", "required": ["minutes", "thaws"], "properties": {
    "minutes": {"type": "array", "items": {"type": "object"}},
    "thaws": {"type": "array", "items": {"type": "object"}}}}
DAILY = {"type": "object", "required": ["days", "deployments"], "properties": {
    "days": {"type": "array", "items": {"type": "string"}},
    "deployments": {"type": "object"}}}
DAY = string_schema(format="date")

routes = [
    ApiRoute("/v1/console/deployments/{name}/activity", deployment_activity, "GET", Operation(
        "Per-minute traffic over the last hour and the recent cold starts of a deployment",
        scope("deploy"), response=ACTIVITY)),
    ApiRoute("/v1/console/usage", daily_usage, "GET", Operation(
        "The billing report of each day in [from, to), by deployment", scope("billing:read"),
        query=(Param("from", DAY, "first day (UTC)"), Param("to", DAY, "day after the last")),
        response=DAILY)),
]
