"""Simple implementations of the two seams, for tests and for embedding.

InMemoryDesiredState is a DesiredStateSource over a list you update;
EventLog is a ReplicaEventSink that keeps every event and every heartbeat in order.
"""
from __future__ import annotations

import asyncio
from typing import Callable, Iterable, Optional

from pool.api import Heartbeat, ReplicaEvent, RevisionSpec, S3Access
from pool.s3 import access_for


class InMemoryDesiredState:
    def __init__(self, specs: Iterable[RevisionSpec] = ()):
        self.specs: list[RevisionSpec] = list(specs)
        self.grants: dict[str, dict[str, S3Access]] = {}     # tenant -> prefix -> access

    async def revisions(self) -> list[RevisionSpec]:
        return list(self.specs)

    async def source_access(self, tenant_id: str, uri: str) -> Optional[S3Access]:
        return access_for(uri, self.grants.get(tenant_id, {}))

    def put(self, spec: RevisionSpec) -> None:
        self.specs = [s for s in self.specs if s.revision_id != spec.revision_id] + [spec]

    def remove(self, revision_id: str) -> None:
        self.specs = [s for s in self.specs if s.revision_id != revision_id]


class EventLog:
    def __init__(self) -> None:
        self.events: list[ReplicaEvent] = []
        self.beats: list[Heartbeat] = []
        self._changed = asyncio.Condition()

    async def replica_changed(self, event: ReplicaEvent) -> None:
        self.events.append(event)
        await self._notify()

    async def heartbeat(self, beat: Heartbeat) -> None:
        self.beats.append(beat)
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def states(self, replica_id: str) -> list[str]:
        return [e.state for e in self.events if e.replica_id == replica_id]

    def replica_ids(self, revision_id: str) -> list[str]:
        seen: dict[str, None] = {}
        for e in self.events:
            if e.revision_id == revision_id:
                seen.setdefault(e.replica_id)
        return list(seen)

    async def wait_for(self, predicate: Callable[[list[ReplicaEvent]], bool], timeout_s: float) -> bool:
        """Wait (event-driven, bounded) until predicate(events) holds (checked after every
        event or heartbeat taken)."""
        async def until() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: predicate(self.events))
        try:
            await asyncio.wait_for(until(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False
