"""The pool's view of Postgres: desired revisions in, replica lifetimes out.

These two own their transactions (the pool calls them from its own loop with
no session of its own): each takes the app's session factory.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.models import Deployment, ReplicaLifetime, Revision
from controlplane.store.deployments import revision_spec
from pool.api import ReplicaEvent, RevisionSpec

STOPPED_STATES = frozenset({"stopped", "failed"})


class PostgresDesiredState:
    """DesiredStateSource: every revision of a live deployment that takes traffic."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]):
        self.sessions = sessions

    async def revisions(self) -> list[RevisionSpec]:
        async with self.sessions() as session:
            rows = (await session.execute(
                select(Deployment, Revision).join(Revision, Revision.deployment_id == Deployment.id)
                .where(Deployment.deleted_at.is_(None))
                .order_by(Deployment.created_at, Revision.number))).tuples().all()
        return [revision_spec(d, r) for d, r in rows if d.traffic.get(r.name, 0) > 0]


class PostgresReplicaEvents:
    """ReplicaEventSink: one replica_lifetimes row per replica, stamped per state."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]):
        self.sessions = sessions

    async def replica_changed(self, event: ReplicaEvent) -> None:
        values: dict[str, Any] = dict(
            replica_id=event.replica_id, revision_id=event.revision_id,
            deployment_id=event.deployment_id, tenant_id=event.tenant_id,
            gpu_count=event.gpu_count, slot_ids=list(event.slot_ids), state=event.state,
            started_at=event.at, reason=event.reason)
        stamps: dict[str, Any] = {"state": event.state}
        if event.slot_ids:
            stamps["slot_ids"] = list(event.slot_ids)
        if event.reason is not None:
            stamps["reason"] = event.reason
        if event.state == "ready":
            values["ready_at"] = stamps["ready_at"] = event.at
        if event.state in STOPPED_STATES:
            values["stopped_at"] = event.at
            stamps["stopped_at"] = event.at
        statement = insert(ReplicaLifetime).values(**values)
        statement = statement.on_conflict_do_update(
            index_elements=[ReplicaLifetime.replica_id], set_=stamps,
            where=ReplicaLifetime.stopped_at.is_(None))
        async with self.sessions() as session, session.begin():
            await session.execute(statement)
