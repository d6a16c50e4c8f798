"""Billing report queries, all in one place: usage rows grouped over a [from, to) window
(each row's cost was fixed when it was written), and the GPU time of replica lifetimes
(controlplane.billing.lifetimes: from placement to the recorded stop or the last heartbeat),
each second at the price book's price in effect then.

Every row carries its token cost, its GPU-seconds and GPU cost, and `cost`, their sum;
the totals are the sum of the rows, so rows add up to totals in every format. GPU time
is grouped like usage: by UTC day, deployment, model or revision; by API key it is one
row of its own, `(gpu time)`, since replicas serve every key.

By adapter, a row is `<deployment>` (the base model) or `<deployment>:<adapter>`. GPU time
stays the base replica's, billed to the base's owner; each lifetime's is shared out
among the base and the adapters that ran on the replica in the window, by their tokens
(prompt + completion) in usage rows naming that replica (controlplane.billing.lifetimes.
gpu_by_share). On a shared base, the tokens of other tenants' calls count too, their
share one row, `<deployment>:(other tenants)`, that names none of them.

Function calls also report what they used, billed by neither column of cost: `items`
(inputs carried) and `function_gpu_seconds`, their share of their batches' compute
(usage_events.gpu_seconds, each call's rounded to the microsecond before the sum, so
every grouping has the same totals). The GPU time they ran on is already the replica
lifetimes' `gpu_seconds`, billed once at `gpu_cost`.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from decimal import Decimal
from typing import Any, Optional

from sqlalchemy import (ColumnElement, Label, Numeric, RowMapping, Select, SQLColumnExpression, and_,
                        cast, func, literal, select)
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.billing.lifetimes import (SECONDS_QUANTUM, GpuUse, Lifetime, Window, gpu_by_key,
                                            gpu_by_share)
from controlplane.store.tables import ApiKey, Deployment, ReplicaLifetime, Revision, UsageEvent
from controlplane.billing.pricing import MONEY_QUANTUM
from controlplane.store import prices

__all__ = ["GROUPS", "COLUMNS", "Row", "Window", "report", "report_rows", "usage_rows",
           "gpu_rows", "lifetimes_in"]

GROUPS = ("day", "deployment", "model", "api_key", "revision", "adapter")
SUMS = ("prompt_tokens", "cached_tokens", "completion_tokens", "items")
COUNTS = ("requests", *SUMS, "partial", "errors")
COLUMNS = ("key", *COUNTS, "function_gpu_seconds", "token_cost", "gpu_seconds", "gpu_cost", "cost")
GPU_TIME_KEY = "(gpu time)"                 # GPU time in a report by API key
OTHER_TENANTS = "(other tenants)"           # their share of a shared base, by adapter


@dataclass(frozen=True)
class Row:
    """One report row (or the totals): usage counts, token cost, GPU time and its cost."""
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    items: int = 0
    partial: int = 0
    errors: int = 0
    function_gpu_seconds: Decimal = Decimal(0)       # reported, not billed (the docstring)
    token_cost: Decimal = Decimal(0)
    gpu_seconds: Decimal = Decimal(0)
    gpu_cost: Decimal = Decimal(0)

    @property
    def cost(self) -> Decimal:
        return self.token_cost + self.gpu_cost

    def __add__(self, other: "Row") -> "Row":
        return Row(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(Row)))

    def with_gpu(self, use: Optional[GpuUse]) -> "Row":
        return self if use is None else replace(self, gpu_seconds=use.seconds, gpu_cost=use.cost)

    def view(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: getattr(self, name) for name in COUNTS}
        out.update(function_gpu_seconds=_seconds(self.function_gpu_seconds),
                   token_cost=_money(self.token_cost), gpu_seconds=_seconds(self.gpu_seconds),
                   gpu_cost=_money(self.gpu_cost), cost=_money(self.cost))
        return out


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
    if group_by == "adapter":               # NULL || text is NULL: the base's key
        return u.deployment_name + func.coalesce(literal(":") + u.adapter_name, literal(""))
    raise ValueError(f"group_by: one of {', '.join(GROUPS)}")


def _aggregates() -> list[ColumnElement[Any]]:
    u = UsageEvent
    return [func.count().label("requests"),
            *[func.coalesce(func.sum(getattr(u, name)), 0).label(name) for name in SUMS],
            func.count().filter(u.status == "partial").label("partial"),
            func.count().filter(u.status == "error").label("errors"),
            func.coalesce(func.sum(func.round(cast(u.gpu_seconds, Numeric), 6)), 0)
            .label("function_gpu_seconds"),
            func.coalesce(func.sum(u.cost), 0).label("token_cost")]


def _scoped(query: Select[Any], tenant_id: str, window: Window) -> Select[Any]:
    u = UsageEvent
    return query.where(u.tenant_id == tenant_id, u.started_at >= window.start,
                       u.started_at < window.end)


async def report(session: AsyncSession, tenant_id: str, window: Window,
                 group_by: str) -> dict[str, Any]:
    rows = await report_rows(session, tenant_id, window, group_by)
    totals = sum(rows.values(), Row())
    return {"tenant_id": tenant_id, "from": window.start.isoformat(),
            "to": window.end.isoformat(), "group_by": group_by,
            "rows": [{"key": key, **rows[key].view()} for key in sorted(rows)],
            "totals": totals.view(),
            "gpu": {"seconds": float(totals.gpu_seconds), "cost": _money(totals.gpu_cost)}}


async def report_rows(session: AsyncSession, tenant_id: str, window: Window,
                      group_by: str) -> dict[str, Row]:
    """The report's rows by key: usage and GPU time together (the margin report's
    revenue, controlplane.store.margin, is these)."""
    usage = await usage_rows(session, tenant_id, window, group_by)
    gpu = await gpu_rows(session, tenant_id, window, group_by)
    return {key: usage.get(key, Row()).with_gpu(gpu.get(key)) for key in {*usage, *gpu}}


async def usage_rows(session: AsyncSession, tenant_id: str, window: Window,
                     group_by: str) -> dict[str, Row]:
    key: Label[str] = _group_key(group_by).label("key")
    query = select(key, *_aggregates()).select_from(UsageEvent)
    if group_by == "api_key":
        query = query.outerjoin(ApiKey, ApiKey.id == UsageEvent.api_key_id)
    query = _scoped(query, tenant_id, window).group_by(key)
    return {r.key: _usage_row(r._mapping) for r in await session.execute(query)}


async def gpu_rows(session: AsyncSession, tenant_id: str, window: Window,
                   group_by: str) -> dict[str, GpuUse]:
    """GPU time of the tenant's replicas inside the window, per report key, priced piece
    by piece where the deployment's price changed."""
    lifetimes, shared = await _lifetimes(session, tenant_id, window, group_by)
    book = await prices.rows_for_tenant(session, tenant_id)
    timelines = {d: prices.applicable(book, d) for d in {t.deployment_id for t in lifetimes}}
    if group_by == "adapter":
        weights = await _token_weights(session, tenant_id, window, lifetimes, shared)
        return gpu_by_share(lifetimes, timelines, window, weights)
    return gpu_by_key(lifetimes, timelines, window, by_day=group_by == "day")


async def _lifetimes(session: AsyncSession, tenant_id: str, window: Window,
                     group_by: str) -> tuple[list[Lifetime], bool]:
    """The tenant's lifetimes that held GPUs in the window, labelled for `group_by`, and
    whether any was of a shared base."""
    r = ReplicaLifetime
    found = (await session.execute(
        select(r.deployment_id, r.gpu_count, r.placed_at, r.stopped_at, r.last_seen_at,
               Deployment.name, Revision.model_uri, Revision.number, r.sleeps, r.replica_id,
               Deployment.shared)
        .outerjoin(Deployment, Deployment.id == r.deployment_id)
        .outerjoin(Revision, Revision.id == r.revision_id)
        .where(r.tenant_id == tenant_id, lifetimes_in(window))
    )).tuples()
    lifetimes, shared = [], False
    for (deployment_id, gpu_count, placed, stopped, seen, name, model, number, sleeps,
         replica_id, is_shared) in found:
        lifetimes.append(Lifetime(deployment_id, gpu_count, placed, stopped, seen,
                                  _gpu_label(group_by, name, model, number),
                                  tuple(sleeps or ()), replica_id))
        shared = shared or bool(is_shared)
    return lifetimes, shared


def lifetimes_in(window: Window) -> ColumnElement[bool]:
    """A lifetime that held GPUs in the window (placed before its end, and ended, as far
    as recorded, after its start)."""
    r = ReplicaLifetime
    return and_(r.placed_at.is_not(None), r.placed_at < window.end,
                func.coalesce(r.stopped_at, r.last_seen_at, r.placed_at) > window.start)


async def _token_weights(session: AsyncSession, tenant_id: str, window: Window,
                         lifetimes: list[Lifetime], shared: bool) -> dict[str, dict[str, int]]:
    """Tokens per report key of each replica's usage rows in the window. Other tenants'
    rows (only a shared base has them) count under one key; they are read only when a
    shared base is in the report, as no index serves a read across tenants."""
    u = UsageEvent
    labels = {t.replica_id: t.label for t in lifetimes}
    if not labels:
        return {}
    is_tenant = u.tenant_id == tenant_id
    own = is_tenant.label("own")
    key: Label[str] = _group_key("adapter").label("key")
    tokens = func.sum(u.prompt_tokens + u.completion_tokens).label("tokens")
    query = (select(u.replica_id, own, key, tokens)
             .where(u.replica_id.in_(list(labels)), u.started_at >= window.start,
                    u.started_at < window.end)
             .group_by(u.replica_id, own, key))
    if not shared:
        query = query.where(is_tenant)
    weights: dict[str, dict[str, int]] = {}
    for replica_id, is_own, row_key, count in (await session.execute(query)).tuples():
        replica = str(replica_id)            # never NULL: it matched a lifetime's
        label = row_key if is_own else f"{labels[replica]}:{OTHER_TENANTS}"
        shares = weights.setdefault(replica, {})
        shares[label] = shares.get(label, 0) + int(count)
    return weights


def _usage_row(m: RowMapping) -> Row:
    """SUM(bigint) is NUMERIC in Postgres: counts back to int."""
    return Row(requests=int(m["requests"]), prompt_tokens=int(m["prompt_tokens"]),
               cached_tokens=int(m["cached_tokens"]),
               completion_tokens=int(m["completion_tokens"]), items=int(m["items"]),
               partial=int(m["partial"]), errors=int(m["errors"]),
               function_gpu_seconds=Decimal(m["function_gpu_seconds"]),
               token_cost=Decimal(m["token_cost"]))


def _gpu_label(group_by: str, name: Optional[str], model: Optional[str],
               number: Optional[int]) -> str:
    if group_by in ("deployment", "adapter"):
        return name or "(deleted)"
    if group_by == "model":
        return model or "(unknown)"
    if group_by == "revision":
        return f"{name or '(deleted)'}/r{number}"
    return GPU_TIME_KEY


def _money(value: Decimal) -> str:
    return f"{Decimal(value).quantize(MONEY_QUANTUM):f}"      # never 0E-15


def _seconds(value: Decimal) -> str:
    return f"{value.quantize(SECONDS_QUANTUM):f}"
