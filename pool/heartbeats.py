"""Heartbeats for billing: every `heartbeat_s`, each replica that holds slots, with the
tokens it says it served (those that answer /stats in time). The control plane closes
GPU time on what the heartbeats stop listing; the first one, sent at start, lists what
the pool holds after re-adoption, and the last, at stop, lists nothing.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Optional

import httpx

from pool.api import Heartbeat
from pool.background import Spawn
from pool.clock import Clock
from pool.health import served_tokens
from pool.registry import ManagedReplica, Registry, holding_slots
from pool.replica_events import ReplicaEvents


@dataclass
class Heartbeats:
    registry: Registry
    events: ReplicaEvents
    clock: Clock
    http: httpx.AsyncClient
    every_s: float
    _last: float = field(default=float("-inf"), init=False)
    _sending: Optional["asyncio.Task[None]"] = field(default=None, init=False)

    def send_if_due(self, spawn: Spawn) -> None:
        """A heartbeat in the background once `every_s` has passed and the last one went."""
        if self.clock.mono() - self._last >= self.every_s and (self._sending is None or self._sending.done()):
            self._sending = spawn(self.send())

    async def send(self) -> None:
        """Queue a heartbeat of the replicas holding slots, with their tokens served."""
        self._last = self.clock.mono()
        holding = holding_slots(self.registry.all())
        counts = await asyncio.gather(*(self._served(m) for m in holding))
        self.events.beat(self.now({m.replica_id: c for m, c in zip(holding, counts) if c}))

    def now(self, tokens: dict[str, tuple[int, int]]) -> Heartbeat:
        """The replicas holding slots at this moment (after the awaits that read tokens)."""
        listed = tuple(m.replica_id for m in holding_slots(self.registry.all()))
        return Heartbeat(self.clock.utc(), listed, {rid: tokens[rid] for rid in listed if rid in tokens})

    async def _served(self, managed: ManagedReplica) -> Optional[tuple[int, int]]:
        handle = managed.handle
        if handle is None or not handle.is_alive():
            return None
        return await served_tokens(handle, self.http)
