"""The replicas an earlier pool left running (a control-plane crash), at start, before
any new replica is placed: each is asked whether it serves its revision, then adopted as
ready on the slots it holds, stopped, or forgotten. The decision is pool/adoption.py's.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import httpx

from pool.adoption import ReplicaRecord, Verdict, adopted_replica, decide
from pool.backends.base import Backend, ReplicaHandle, Survivor
from pool.capacity import Capacity
from pool.clock import Clock
from pool.health import serves
from pool.registry import ManagedReplica, Registry, RevisionState
from pool.replica_events import ReplicaEvents

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Survivors:
    backend: Backend
    capacity: Capacity
    registry: Registry
    events: ReplicaEvents
    clock: Clock
    http: httpx.AsyncClient
    stop_timeout_s: float

    async def take_over(self) -> None:
        survivors = await self.backend.survivors()
        answered = await asyncio.gather(*(self._answers(s) for s in survivors))
        slot_ids = {s.slot_id for s in self.capacity.slots}
        stopping = []
        for survivor, answers in zip(survivors, answered):
            record, handle = survivor.record, survivor.handle
            rev = self.registry.deployed(record.revision_id)
            verdict, why = decide(record, alive=handle is not None, answers=answers,
                                  wanted=rev.spec if rev else None, slot_ids=slot_ids)
            log.info("replica %s of revision %s, left by an earlier pool: %s (%s)",
                     record.replica_id, record.revision_id, verdict.value, why)
            if verdict is Verdict.ADOPT and rev is not None and handle is not None:
                self._adopt(rev, record, handle)
            elif handle is not None:
                stopping.append(self._stop(handle))
        await asyncio.gather(*stopping, return_exceptions=True)

    async def _answers(self, survivor: Survivor) -> bool:
        handle = survivor.handle
        return handle is not None and await serves(handle, self.http, survivor.record.revision_id)

    def _adopt(self, rev: RevisionState, record: ReplicaRecord, handle: ReplicaHandle) -> None:
        """Ready again, on the slots it holds (booked before anything else is placed)."""
        now = self.clock.mono()
        placed = self.capacity.hold(record.replica_id, rev.spec.tenant_id, record.node, record.slot_ids,
                                    record.bytes_per_slot)
        managed = ManagedReplica(adopted_replica(record, now, self.clock.utc()), rev.spec,
                                 handle=handle, placed=placed)
        rev.add(managed)
        rev.last_activity = now                  # idle from now on, not since the crash
        self.events.publish(managed)

    async def _stop(self, handle: ReplicaHandle) -> None:
        try:
            await handle.stop(self.stop_timeout_s)
        finally:
            self.backend.forget(handle)
