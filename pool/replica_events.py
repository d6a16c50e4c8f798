"""Replica transitions, each published as a ReplicaEvent to the control plane's sink.

The sink records replica lifetimes for GPU-second billing, so every
transition must reach it, in order. `move` is the one way the pool changes a
replica's state, and it queues the event; one task hands the queue to the
sink, so a slow or failing sink never blocks or stops the pool. `close`
waits (bounded) for the queue to empty before it stops that task.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Optional

from pool.api import ReplicaEvent, ReplicaEventSink
from pool.clock import Clock
from pool.registry import ManagedReplica
from pool.replica import ReplicaState

log = logging.getLogger(__name__)


class ReplicaEvents:
    def __init__(self, sink: ReplicaEventSink, clock: Clock):
        self.sink = sink
        self.clock = clock
        self._queue: asyncio.Queue[ReplicaEvent] = asyncio.Queue()
        self._sender: Optional[asyncio.Task[None]] = None

    def start(self) -> None:
        self._sender = asyncio.ensure_future(self._send())

    async def close(self, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(self._queue.join(), timeout_s)
        except asyncio.TimeoutError:
            log.warning("replica event sink did not take %d events before stop", self._queue.qsize())
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)

    def move(self, managed: ManagedReplica, state: ReplicaState, reason: Optional[str] = None) -> None:
        managed.replica.move(state, self.clock.mono(), self.clock.utc(), reason)
        self.publish(managed)

    def publish(self, managed: ManagedReplica) -> None:
        """The replica's latest transition (its creation, for a new one) as an event."""
        step = managed.replica.history[-1]
        spec = managed.spec
        self._queue.put_nowait(ReplicaEvent(
            replica_id=managed.replica_id, revision_id=spec.revision_id, deployment_id=spec.deployment_id,
            tenant_id=spec.tenant_id, state=step.state.value, at=step.at, gpu_count=spec.gpu_count,
            slot_ids=managed.replica.slot_ids, reason=step.reason))

    async def _send(self) -> None:
        while True:
            event = await self._queue.get()
            try:
                await self.sink.replica_changed(event)
            except Exception:  # noqa: BLE001 - a sink failure must not stop the pool
                log.exception("replica event sink failed for %s", event)
            finally:
                self._queue.task_done()
