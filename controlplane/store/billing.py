"""Billing report queries, all in one place: usage rows grouped over a [from, to) window,
and the GPU-seconds of replica lifetimes priced with `pricing.gpu_cost`."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (ColumnElement, Label, RowMapping, Select, SQLColumnExpression, and_,
                        func, literal, select)
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.models import ApiKey, ReplicaLifetime, Revision, UsageEvent
from controlplane.pricing import MONEY_QUANTUM, gpu_cost
from controlplane.store.deployments import pricing_of

GROUPS = ("day", "deployment", "model", "api_key", "revision")
SUMS = ("prompt_tokens", "cached_tokens", "completion_tokens")
COLUMNS = ("key", "requests", *SUMS, "partial", "errors", "cost")


@dataclass(frozen=True)
class Window:
    start: datetime     # inclusive, UTC
    end: datetime       # exclusive, UTC


def _group_key(group_by: str) -> SQLColumnExpression[str]:
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


def _aggregates() -> list[ColumnElement[Any]]:
    u = UsageEvent
    return [func.count().label("requests"),
            *[func.coalesce(func.sum(getattr(u, name)), 0).label(name) for name in SUMS],
            func.count().filter(u.status == "partial").label("partial"),
            func.count().filter(u.status == "error").label("errors"),
            func.coalesce(func.sum(u.cost), 0).label("cost")]


def _scoped(query: Select[Any], tenant_id: str, window: Window) -> Select[Any]:
    u = UsageEvent
    return query.where(u.tenant_id == tenant_id, u.started_at >= window.start,
                       u.started_at < window.end)


async def report(session: AsyncSession, tenant_id: str, window: Window,
                 group_by: str) -> dict[str, Any]:
    key: Label[str] = _group_key(group_by).label("key")
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


async def gpu_usage(session: AsyncSession, tenant_id: str, window: Window) -> dict[str, Any]:
    """GPU-seconds of replicas alive inside the window, each revision's at its price."""
    r = ReplicaLifetime
    start = func.greatest(r.started_at, window.start)
    end = func.least(func.coalesce(r.stopped_at, func.now()), window.end)
    seconds = func.greatest(func.extract("epoch", end - start), 0) * r.gpu_count
    query = (select(Revision, func.sum(seconds).label("seconds"))
             .select_from(r).join(Revision, Revision.id == r.revision_id)
             .where(and_(r.tenant_id == tenant_id, r.started_at < window.end,
                         func.coalesce(r.stopped_at, window.end) > window.start))
             .group_by(Revision.id))
    per_revision = [(revision, Decimal(seconds))
                    for revision, seconds in (await session.execute(query)).tuples()]
    cost = sum((gpu_cost(pricing_of(revision), seconds) for revision, seconds in per_revision),
               Decimal(0))
    return {"seconds": float(sum((seconds for _, seconds in per_revision), Decimal(0))),
            "cost": str(cost.quantize(MONEY_QUANTUM))}


def _plain(mapping: RowMapping) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in mapping.items():
        if name == "cost":
            out[name] = str(Decimal(value).quantize(MONEY_QUANTUM))
        elif name == "key":
            out[name] = value
        else:
            out[name] = int(value)      # SUM(bigint) is NUMERIC in Postgres
    return out
