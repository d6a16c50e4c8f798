"""The pool's view of Postgres: desired revisions in, replica lifetimes out.

These two own their transactions (the pool calls them from its own loop with
no session of its own): each takes the app's session factory.
"""
from __future__ import annotations

import logging
from typing import Any, Optional

from sqlalchemy import case, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.store.tables import Deployment, ReplicaLifetime, Revision
from controlplane.quotas import Quota
from controlplane.sealing import Sealer
from controlplane.store.deployments import revision_spec
from controlplane.store.failures import is_outage
from controlplane.store.model_sources import access_for_tenant
from controlplane.store.quotas import quotas_by_tenant
from pool.api import Heartbeat, ReplicaEvent, RevisionSpec, S3Access

STOPPED_STATES = frozenset({"stopped", "failed"})
LOST = "lost"          # closed by a heartbeat that no longer listed it
SLEEPING, WAKING = "sleeping", "waking"     # the sleep tier: GPUs given back, and taken again
log = logging.getLogger("thawpool.desired_state")


class PostgresDesiredState:
    """DesiredStateSource: every revision of a live deployment that takes traffic, with
    its tenant's quota (the admin's overrides over `default_quota`), and the credentials
    of a tenant's own bucket (opened by `sealer`). While Postgres is out, the last
    answer it gave: the pool keeps serving what it was serving."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], default_quota: Quota, sealer: Sealer):
        self.sessions = sessions
        self.default_quota = default_quota
        self.sealer = sealer
        self._last: Optional[list[RevisionSpec]] = None
        self._accesses: dict[tuple[str, str], Optional[S3Access]] = {}

    async def revisions(self) -> list[RevisionSpec]:
        try:
            self._last = await self._read()
        except Exception as exc:
            if self._last is None or not is_outage(exc):
                raise
            log.warning("desired state: postgres is out, the last one read stands",
                        extra={"error": repr(exc)[:300]})
        return list(self._last)

    async def source_access(self, tenant_id: str, uri: str) -> Optional[S3Access]:
        try:
            async with self.sessions() as session:
                access = await access_for_tenant(session, tenant_id, uri, self.sealer)
        except Exception as exc:
            if (tenant_id, uri) not in self._accesses or not is_outage(exc):
                raise
            return self._accesses[(tenant_id, uri)]
        self._accesses[(tenant_id, uri)] = access
        return access

    async def _read(self) -> list[RevisionSpec]:
        async with self.sessions() as session:
            rows = (await session.execute(
                select(Deployment, Revision).join(Revision, Revision.deployment_id == Deployment.id)
                .where(Deployment.deleted_at.is_(None))
                .order_by(Deployment.created_at, Revision.number))).tuples().all()
            quotas = await quotas_by_tenant(session, self.default_quota)
        return [revision_spec(d, r, quotas.get(d.tenant_id, self.default_quota).for_pool())
                for d, r in rows if d.traffic.get(r.name, 0) > 0]


class PostgresReplicaEvents:
    """ReplicaEventSink: one replica_lifetimes row per replica, billed as
    controlplane.billing.lifetimes says (placed_at to stopped_at, or to last_seen_at).

    A row closes once: events after its stop are ignored, except that a recorded stop
    replaces the close a heartbeat made when the replica went missing (`lost`), since
    the pool retries the stop event in order and it may arrive after that heartbeat.
    A `sleeping` and a `waking` event each add their time to `sleeps` (once: a retried
    one finds its state already recorded); a sleeper is in no heartbeat and is not
    lost for it (it bills nothing meanwhile). The kind of its slots is kept from the
    latest event that named it."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]):
        self.sessions = sessions

    async def replica_changed(self, event: ReplicaEvent) -> None:
        async with self.sessions() as session, session.begin():
            await session.execute(_upsert(event))

    async def heartbeat(self, beat: Heartbeat) -> None:
        """Stamp the listed replicas' open lifetimes as seen at `beat.at`; close every other
        open lifetime that held GPUs at its own last-seen time (a lifetime still waiting
        for slots bills nothing and stays open for its placement)."""
        r, ids = ReplicaLifetime, list(beat.replica_ids)
        seen = update(r).where(r.stopped_at.is_(None), r.replica_id.in_(ids)).values(
            last_seen_at=func.greatest(func.coalesce(r.last_seen_at, beat.at), beat.at))
        lost = update(r).where(r.stopped_at.is_(None), r.placed_at.is_not(None), r.state != SLEEPING,
                               r.replica_id.not_in(ids)).values(
            stopped_at=func.greatest(func.coalesce(r.last_seen_at, r.placed_at), r.placed_at),
            state=LOST, reason=f"lost: not in the pool's heartbeat at {beat.at.isoformat()}")
        async with self.sessions() as session, session.begin():
            await session.execute(seen)
            await session.execute(lost)
            for replica_id, (prompt, completion) in beat.tokens.items():
                await session.execute(update(r).where(
                    r.replica_id == replica_id, r.stopped_at.is_(None)).values(
                    **_served(prompt, completion)))


def _served(prompt: int, completion: int) -> dict[str, Any]:
    """The replica's counters, never moved back by a late report."""
    r = ReplicaLifetime
    return {"served_prompt_tokens": func.greatest(func.coalesce(r.served_prompt_tokens, 0), prompt),
            "served_completion_tokens": func.greatest(
                func.coalesce(r.served_completion_tokens, 0), completion)}


def _upsert(event: ReplicaEvent) -> Any:
    """The event as an INSERT of a new lifetime, or an update of the open one."""
    r, stopping = ReplicaLifetime, event.state in STOPPED_STATES
    values: dict[str, Any] = dict(
        replica_id=event.replica_id, revision_id=event.revision_id,
        deployment_id=event.deployment_id, tenant_id=event.tenant_id,
        gpu_count=event.gpu_count, slot_ids=list(event.slot_ids), state=event.state,
        started_at=event.at, reason=event.reason, last_seen_at=event.at,
        placed_at=event.at if event.slot_ids else None, gpu_kind=event.gpu_kind,
        ready_at=event.at if event.state == "ready" else None,
        loading_at=event.at if event.state == "loading" else None,
        stopped_at=event.at if stopping else None)
    stamps: dict[str, Any] = {
        "state": event.state,
        "last_seen_at": func.greatest(func.coalesce(r.last_seen_at, event.at), event.at)}
    if event.slot_ids:
        stamps["slot_ids"] = list(event.slot_ids)
        stamps["placed_at"] = func.coalesce(r.placed_at, event.at)
    if event.gpu_kind is not None:
        stamps["gpu_kind"] = event.gpu_kind
    if event.state in (SLEEPING, WAKING):      # a retried event is added once
        stamps["sleeps"] = case((r.state == event.state, r.sleeps),
                                else_=func.array_append(r.sleeps, event.at))
    if event.reason is not None:
        stamps["reason"] = event.reason
    if event.state == "loading":
        stamps["loading_at"] = event.at
    if event.state == "ready":
        stamps["ready_at"] = func.coalesce(r.ready_at, event.at)   # its cold start's, not a wake's
    if stopping:
        stamps["stopped_at"] = func.greatest(func.coalesce(r.stopped_at, event.at), event.at)
    if event.prompt_tokens is not None and event.completion_tokens is not None:
        values.update(served_prompt_tokens=event.prompt_tokens,
                      served_completion_tokens=event.completion_tokens)
        stamps.update(_served(event.prompt_tokens, event.completion_tokens))
    takes = (r.stopped_at.is_(None) | (r.state == LOST)) if stopping else r.stopped_at.is_(None)
    return insert(r).values(**values).on_conflict_do_update(
        index_elements=[r.replica_id], set_=stamps, where=takes)
