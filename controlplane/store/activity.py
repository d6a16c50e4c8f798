"""What the web console draws for one deployment, read from the control plane's own
records: per-minute traffic from the usage rows (requests, tokens, mean TTFT) and the
recent cold starts ("thaws") from the replica lifetimes joined with the first request
each replica served.

A thaw's stages follow one another: `queue` (the first request arrived to its replica
was started), `placement` (started to placed: waiting for slots and quota),
`download` (placed to loading: the weights into the node's cache), `load` (loading to
ready: the runtime process starts and loads them), `first_token` (ready to the first
request's first token). A lifetime from before migration 0007 has no loading time: its
download and load are one stage, `download_load`, and both of those are None.

A call for a LoRA adapter its warm replica lacked waited for no replica, only for the
adapter's load: its thaw has `kind` "adapter" and the stages `queue` (for a ready
replica), `adapter_load` and `first_token` (the rest of its time to the first token).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Optional

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.store.tables import ReplicaLifetime, UsageEvent

MINUTE = timedelta(minutes=1)


@dataclass(frozen=True)
class Minute:
    at: datetime
    requests: int
    tokens: int
    ttft_s: Optional[float]


async def minutes(session: AsyncSession, tenant_id: str, deployment_id: str,
                  since: datetime) -> list[Minute]:
    """One entry per minute that saw requests, oldest first."""
    u = UsageEvent
    minute = func.date_trunc("minute", u.started_at).label("minute")
    rows = await session.execute(
        select(minute, func.count(), func.coalesce(func.sum(u.completion_tokens), 0),
               func.avg(u.ttft_s))
        .where(u.tenant_id == tenant_id, u.deployment_id == deployment_id, u.started_at >= since)
        .group_by(minute).order_by(minute))
    return [Minute(at, int(n), int(tokens), float(ttft) if ttft is not None else None)
            for at, n, tokens, ttft in rows.tuples()]


async def thaws(session: AsyncSession, tenant_id: str, deployment_id: str,
                limit: int = 10) -> list[dict[str, Any]]:
    """The latest replicas that became ready and adapters loaded into warm ones, newest
    first, each with its stages in seconds (None where a time is not known)."""
    r = ReplicaLifetime
    lifetimes = (await session.scalars(
        select(r).where(r.tenant_id == tenant_id, r.deployment_id == deployment_id,
                        r.ready_at.is_not(None))
        .order_by(r.started_at.desc()).limit(limit))).all()
    found = [await _thaw(session, lifetime) for lifetime in lifetimes]
    found += await _adapter_loads(session, tenant_id, deployment_id, limit)
    return sorted(found, key=lambda t: t["started_at"], reverse=True)[:limit]


async def _adapter_loads(session: AsyncSession, tenant_id: str, deployment_id: str,
                         limit: int) -> list[dict[str, Any]]:
    u = UsageEvent
    rows = (await session.scalars(
        select(u).where(u.tenant_id == tenant_id, u.deployment_id == deployment_id,
                        u.adapter_load_s.is_not(None))
        .order_by(u.started_at.desc()).limit(limit))).all()
    return [{"replica_id": row.replica_id, "started_at": row.started_at.isoformat(), "kind": "adapter",
             "adapter": row.adapter_name,
             "stages": {"queue": row.queue_s, "adapter_load": row.adapter_load_s,
                        "first_token": None if row.ttft_s is None else
                        max(0.0, row.ttft_s - (row.queue_s or 0.0) - (row.adapter_load_s or 0.0))}}
            for row in rows]


async def _thaw(session: AsyncSession, lifetime: ReplicaLifetime) -> dict[str, Any]:
    u = UsageEvent
    first = (await session.execute(
        select(u.started_at, u.ttft_s).where(u.replica_id == lifetime.replica_id)
        .order_by(u.started_at).limit(1))).first()
    arrived, first_token = None, None
    if first is not None:
        arrived = first.started_at
        if first.ttft_s is not None:
            first_token = first.started_at + timedelta(seconds=first.ttft_s)
    return {"replica_id": lifetime.replica_id, "started_at": lifetime.started_at.isoformat(), "kind": "replica",
            "stages": {"queue": _seconds(arrived, lifetime.started_at),
                       "placement": _seconds(lifetime.started_at, lifetime.placed_at),
                       **_download_load(lifetime),
                       "first_token": _seconds(lifetime.ready_at, first_token)}}


def _download_load(lifetime: ReplicaLifetime) -> dict[str, Optional[float]]:
    placed, loading, ready = lifetime.placed_at, lifetime.loading_at, lifetime.ready_at
    if loading is None:
        return {"download": None, "load": None, "download_load": _seconds(placed, ready)}
    return {"download": _seconds(placed, loading), "load": _seconds(loading, ready),
            "download_load": None}


def _seconds(start: Optional[datetime], end: Optional[datetime]) -> Optional[float]:
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())
