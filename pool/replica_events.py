"""Replica transitions and heartbeats, handed to the control plane's sink in order.

The sink records replica lifetimes for GPU-second billing, so every
transition must reach it, in order. `move` is the one way the pool changes a
replica's state, and it queues the event; `beat` queues a Heartbeat. One
task hands the queue to the sink, so a slow or failing sink never blocks or
stops the pool: what the sink fails to take stays at the head of the queue
and is offered again after a backoff (`retry_delay`), never dropped or
reordered. Only the newest heartbeat matters: a new one replaces those still
queued (not the one being sent), behind the events queued before it.

The queue is bounded (`event_queue_limit` events; heartbeats never count): a
sink down for that long loses the newest events, each logged as an error
(the heartbeats then close those lifetimes). `close` waits (bounded) for the
queue to empty before it stops the task.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Callable, Optional, Sequence, Union

from pool.api import Heartbeat, ReplicaEvent, ReplicaEventSink
from pool.clock import Clock
from pool.registry import ManagedReplica
from pool.replica import ReplicaState

log = logging.getLogger(__name__)
Item = Union[ReplicaEvent, Heartbeat]
KindOf = Callable[[Sequence[str]], Optional[str]]     # slot ids -> their kind (Capacity.kind_of)
SINK_TIMEOUT_S = 30.0                   # one call to the sink, at most; then it is retried
FIRST_RETRY_S = 0.1


def retry_delay(failures: int, cap_s: float) -> float:
    """Seconds before the next try after `failures` failures in a row: 0.1, 0.2, 0.4, ... cap_s."""
    return min(cap_s, FIRST_RETRY_S * 2.0 ** min(30, max(0, failures - 1)))


class ReplicaEvents:
    def __init__(self, sink: ReplicaEventSink, clock: Clock, *, limit: int = 10000, retry_cap_s: float = 10.0,
                 kind_of: Optional[KindOf] = None):
        self.sink = sink
        self.clock = clock
        self.kind_of = kind_of           # None: events name no slot kind
        self.limit = limit
        self.retry_cap_s = retry_cap_s
        self.dropped = 0                 # events refused because the queue was full
        self.pending = 0                 # events (not heartbeats) the sink has not taken yet
        self._items: deque[Item] = deque()
        self._in_flight: Optional[Item] = None
        self._queued = asyncio.Event()   # set while the queue has items
        self._sender: Optional[asyncio.Task[None]] = None

    def start(self) -> None:
        self._sender = asyncio.ensure_future(self._send())

    async def close(self, timeout_s: float) -> None:
        if self._sender is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._items and loop.time() < deadline:
            await asyncio.sleep(0.02)
        if self._items:
            log.error("replica event sink did not take %d event(s) before stop; their lifetimes "
                      "are closed by the next pool's first heartbeat", self.pending)
        self._sender.cancel()
        await asyncio.gather(self._sender, return_exceptions=True)

    def move(self, managed: ManagedReplica, state: ReplicaState, reason: Optional[str] = None) -> None:
        managed.replica.move(state, self.clock.mono(), self.clock.utc(), reason)
        self.publish(managed)

    def publish(self, managed: ManagedReplica) -> None:
        """The replica's latest transition (its creation, for a new one) as an event; a
        `stopped` one carries the counters read as it stopped, one with slots their kind."""
        step = managed.replica.history[-1]
        spec = managed.spec
        tokens = managed.final_tokens if step.state is ReplicaState.STOPPED else None
        slot_ids = managed.replica.slot_ids
        self._put(ReplicaEvent(
            replica_id=managed.replica_id, revision_id=spec.revision_id, deployment_id=spec.deployment_id,
            tenant_id=spec.tenant_id, state=step.state.value, at=step.at, gpu_count=spec.gpu_count,
            slot_ids=slot_ids, reason=step.reason,
            gpu_kind=self.kind_of(slot_ids) if slot_ids and self.kind_of else None,
            prompt_tokens=tokens[0] if tokens else None, completion_tokens=tokens[1] if tokens else None))

    def beat(self, beat: Heartbeat) -> None:
        """Queue a heartbeat behind every event queued so far; it replaces older ones not sent yet."""
        self._items = deque(item for item in self._items
                            if not isinstance(item, Heartbeat) or item is self._in_flight)
        self._items.append(beat)
        self._queued.set()

    def _put(self, event: ReplicaEvent) -> None:
        if self.pending >= self.limit:
            self.dropped += 1
            log.error("replica event queue is full (%d events the sink has not taken): dropped the %s "
                      "event of replica %s (%d dropped so far); heartbeats close its lifetime",
                      self.limit, event.state, event.replica_id, self.dropped)
            return
        self._items.append(event)
        self.pending += 1
        self._queued.set()

    async def _send(self) -> None:
        failures = 0
        while True:
            await self._queued.wait()
            item = self._in_flight = self._items[0]
            try:
                async with asyncio.timeout(SINK_TIMEOUT_S):    # (wait_for may swallow a cancel)
                    await self._deliver(item)
            except Exception as exc:  # noqa: BLE001 - a sink failure must not stop the pool
                failures += 1
                self._in_flight = None
                delay = retry_delay(failures, self.retry_cap_s)
                log.warning("replica event sink failed (%d in a row) for %s: %s: %s; retrying in %.1fs",
                            failures, describe(item), type(exc).__name__, exc, delay)
                await asyncio.sleep(delay)
                continue
            failures, self._in_flight = 0, None
            if isinstance(self._items.popleft(), ReplicaEvent):
                self.pending -= 1
            if not self._items:
                self._queued.clear()

    async def _deliver(self, item: Item) -> None:
        if isinstance(item, Heartbeat):
            await self.sink.heartbeat(item)
        else:
            await self.sink.replica_changed(item)


def describe(item: Item) -> str:
    if isinstance(item, Heartbeat):
        return f"the heartbeat of {len(item.replica_ids)} replica(s) at {item.at.isoformat()}"
    return f"the {item.state} event of replica {item.replica_id}"
