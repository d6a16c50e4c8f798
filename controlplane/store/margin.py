"""The margin report's queries (admin only): every tenant's revenue over [from, to), from
the billing report's own rows (store.billing.report_rows: nothing of the money math is
done twice), against what the replicas' GPU time cost the platform (the cost book) and
what drives that cost (controlplane.billing.margin does the arithmetic, purely).

Rows are by tenant, or by deployment within its tenant (`<tenant>/<deployment>`): one
tenant's numbers never reach another's row. Revenue is the billed tenant's; GPU time and
its cost are the replica's owner's, so the callers of a shared base show their revenue
in rows of their own and the base's cost shows in its owner's.

Reading every tenant's usage rows of a window is a scan of that window (the usage index
leads with the tenant): a report for operators, not for the request path.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any, Optional

from sqlalchemy import select, union
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.billing.lifetimes import Lifetime, Span, Window
from controlplane.billing.margin import (ReplicaLife, Revenue, Serving, quantization_of,
                                         row_view, serving_by_group)
from controlplane.store import billing, gpu_costs
from controlplane.store.tables import (Deployment, ReplicaLifetime, Revision, Tenant,
                                       UsageEvent)

GROUPS = ("deployment", "tenant")
DELETED = "(deleted)"                       # as the billing report names a deployment gone


async def report(session: AsyncSession, window: Window, group_by: str) -> dict[str, Any]:
    if group_by not in GROUPS:
        raise ValueError(f"group_by: one of {', '.join(GROUPS)}")
    names = await _tenant_names(session, window)
    revenue = await _revenue(session, window, names, group_by)
    lives = await _lives(session, window, names, group_by)
    calls = await _calls(session, window, [life.lifetime.replica_id for _, life in lives])
    costs = serving_by_group(lives, calls, await gpu_costs.cost_rows(session), window)
    keys = sorted({*revenue, *costs})
    totals = (sum((revenue.get(k, Revenue()) for k in keys), Revenue()),
              sum((costs.get(k, Serving()) for k in keys), Serving()))
    return {"from": window.start.isoformat(), "to": window.end.isoformat(), "group_by": group_by,
            "rows": [{"key": key, **_names(key, group_by),
                      **row_view(revenue.get(key, Revenue()), costs.get(key, Serving()))}
                     for key in keys],
            "totals": row_view(*totals)}


async def _tenant_names(session: AsyncSession, window: Window) -> dict[str, str]:
    """Every tenant with usage or GPU time in the window, by id: its name (its id when
    the tenant is gone, since usage rows and lifetimes outlive it)."""
    u, r = UsageEvent, ReplicaLifetime
    ids = union(select(u.tenant_id).where(u.started_at >= window.start, u.started_at < window.end),
                select(r.tenant_id).where(billing.lifetimes_in(window)))
    found = [str(i) for i in await session.scalars(select(ids.subquery().c[0]))]
    named = dict((await session.execute(
        select(Tenant.id, Tenant.name).where(Tenant.id.in_(found)))).tuples().all())
    return {tenant_id: named.get(tenant_id, tenant_id) for tenant_id in found}


async def _revenue(session: AsyncSession, window: Window, names: dict[str, str],
                   group_by: str) -> dict[str, Revenue]:
    """Each tenant's billing report by deployment, regrouped by the margin's keys."""
    revenue: dict[str, Revenue] = {}
    for tenant_id, tenant in names.items():
        rows = await billing.report_rows(session, tenant_id, window, "deployment")
        for deployment, row in rows.items():
            key = _key(group_by, tenant, deployment)
            revenue[key] = revenue.get(key, Revenue()) + Revenue(
                row.requests, row.prompt_tokens, row.cached_tokens, row.completion_tokens,
                row.token_cost, row.gpu_cost)
    return revenue


async def _lives(session: AsyncSession, window: Window, names: dict[str, str],
                 group_by: str) -> list[tuple[str, ReplicaLife]]:
    """Every lifetime that held GPUs in the window, with its key, kind and quantization."""
    r = ReplicaLifetime
    found = (await session.execute(
        select(r.replica_id, r.tenant_id, r.deployment_id, r.gpu_count, r.placed_at, r.stopped_at,
               r.last_seen_at, r.sleeps, r.gpu_kind, Deployment.name, Revision.engine,
               Revision.weights)
        .outerjoin(Deployment, Deployment.id == r.deployment_id)
        .outerjoin(Revision, Revision.id == r.revision_id)
        .where(billing.lifetimes_in(window)))).tuples()
    lives = []
    for (replica_id, tenant_id, deployment_id, gpus, placed, stopped, seen, sleeps, kind,
         deployment, engine, weights) in found:
        lifetime = Lifetime(str(deployment_id), gpus, placed, stopped, seen,
                            sleeps=tuple(sleeps or ()), replica_id=replica_id)
        key = _key(group_by, names.get(str(tenant_id), str(tenant_id)), deployment or DELETED)
        lives.append((key, ReplicaLife(lifetime, kind, quantization_of(engine or {}, weights))))
    return lives


async def _calls(session: AsyncSession, window: Window,
                 replica_ids: list[str]) -> dict[str, list[Span]]:
    """Each replica's calls that ran in the window, any tenant's, as [start + queue wait,
    finish) (a call's start is never after its finish)."""
    if not replica_ids:
        return {}
    u = UsageEvent
    found = (await session.execute(
        select(u.replica_id, u.started_at, u.queue_s, u.finished_at)
        .where(u.replica_id.in_(replica_ids), u.started_at < window.end,
               u.finished_at > window.start))).tuples()
    calls: dict[str, list[Span]] = {}
    for replica_id, started, queue_s, finished in found:
        start = min(started + timedelta(seconds=max(queue_s or 0.0, 0.0)), finished)
        calls.setdefault(str(replica_id), []).append((start, finished))
    return calls


def _key(group_by: str, tenant: str, deployment: str) -> str:
    return tenant if group_by == "tenant" else f"{tenant}/{deployment}"


def _names(key: str, group_by: str) -> dict[str, Optional[str]]:
    """The key's tenant and deployment (a tenant's name or id holds no '/')."""
    if group_by == "tenant":
        return {"tenant": key, "deployment": None}
    tenant, _, deployment = key.partition("/")
    return {"tenant": tenant, "deployment": deployment}
