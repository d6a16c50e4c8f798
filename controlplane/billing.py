"""Billing report queries, all in one place: usage rows grouped over a [from, to) window."""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy import and_, func, literal, select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.models import ApiKey, ReplicaLifetime, Revision, UsageEvent

GROUPS = ("day", "deployment", "model", "api_key", "revision")
SUMS = ("prompt_tokens", "cached_tokens", "completion_tokens")
COLUMNS = ("key", "requests", *SUMS, "partial", "errors", "cost")


@dataclass(frozen=True)
class Window:
    start: datetime     # inclusive, UTC
    end: datetime       # exclusive, UTC


def _group_key(group_by: str):
    u = UsageEvent
    if group_by == "day":
        return func.to_char(func.timezone("UTC", u.started_at), "YYYY-MM-DD")
    if group_by == "deployment":
        return u.deployment_name
    if group_by == "model":
        return u.model
    if group_by == "api_key":
        return func.coalesce(ApiKey.prefix, literal("(none)"))
    if group_by == "revision":
        return u.deployment_name + literal("/") + u.revision_name
    raise ValueError(f"group_by: one of {', '.join(GROUPS)}")


def _aggregates():
    u = UsageEvent
    return [func.count().label("requests"),
            *[func.coalesce(func.sum(getattr(u, name)), 0).label(name) for name in SUMS],
            func.count().filter(u.status == "partial").label("partial"),
            func.count().filter(u.status == "error").label("errors"),
            func.coalesce(func.sum(u.cost), 0).label("cost")]


def _scoped(query, tenant_id: str, window: Window):
    u = UsageEvent
    return query.where(u.tenant_id == tenant_id, u.started_at >= window.start,
                       u.started_at < window.end)


async def report(session: AsyncSession, tenant_id: str, window: Window, group_by: str) -> dict:
    key = _group_key(group_by).label("key")
    rows_query = select(key, *_aggregates()).select_from(UsageEvent)
    if group_by == "api_key":
        rows_query = rows_query.outerjoin(ApiKey, ApiKey.id == UsageEvent.api_key_id)
    rows_query = _scoped(rows_query, tenant_id, window).group_by(key).order_by(key)
    totals_query = _scoped(select(*_aggregates()).select_from(UsageEvent), tenant_id, window)
    rows = [_plain(r._mapping) for r in await session.execute(rows_query)]
    totals = _plain((await session.execute(totals_query)).one()._mapping)
    return {"tenant_id": tenant_id, "from": window.start.isoformat(),
            "to": window.end.isoformat(), "group_by": group_by, "rows": rows,
            "totals": totals, "gpu": await gpu_usage(session, tenant_id, window)}


async def gpu_usage(session: AsyncSession, tenant_id: str, window: Window) -> dict:
    """GPU-seconds of replicas alive inside the window, priced per revision."""
    r = ReplicaLifetime
    start = func.greatest(r.started_at, window.start)
    end = func.least(func.coalesce(r.stopped_at, func.now()), window.end)
    seconds = func.greatest(func.extract("epoch", end - start), 0) * r.gpu_count
    query = (select(func.coalesce(func.sum(seconds), 0).label("seconds"),
                    func.coalesce(func.sum(seconds * Revision.gpu_second), 0).label("cost"))
             .select_from(r).join(Revision, Revision.id == r.revision_id)
             .where(and_(r.tenant_id == tenant_id, r.started_at < window.end,
                         func.coalesce(r.stopped_at, window.end) > window.start)))
    row = (await session.execute(query)).one()
    return {"seconds": float(row.seconds),
            "cost": str(Decimal(row.cost).quantize(Decimal("1e-15")))}


def _plain(mapping) -> dict:
    out = {}
    for name, value in mapping.items():
        if name == "cost":
            out[name] = str(Decimal(value).quantize(Decimal("1e-15")))
        elif name == "key":
            out[name] = value
        else:
            out[name] = int(value)      # SUM(bigint) is NUMERIC in Postgres
    return out


def to_csv(report_body: dict) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in report_body["rows"]:
        writer.writerow([row[c] for c in COLUMNS])
    writer.writerow(["TOTAL", *[report_body["totals"][c] for c in COLUMNS[1:]]])
    return buffer.getvalue()
