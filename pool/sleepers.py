"""The sleep tier's orchestration: which sleeper wakes, which stop to make room, and a
replica's fall into sleep and its wake, with a stop where either fails. The I/O is
pool/sleep_tier.py's; the host-memory budget pool/sleep_budget.py's.

A revision with `sleep_timeout_s` drains its idle replicas into sleep instead of
stopping them; a request, or any scale-up, wakes sleepers before it starts new
replicas; sleepers stop after their timeout or to make room in their node's budget,
and a sleeper that cannot have its slots back or fails to wake is stopped for a cold
start.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Optional

from pool.background import Spawn
from pool.registry import ManagedReplica, Registry, RevisionState
from pool.replica import ReplicaState
from pool.settings import PoolSettings
from pool.sleep_budget import Sleeper, make_room
from pool.sleep_tier import SleepFailed, SleepTier
from pool.stopping import ReplicaStopper


SLEEPING, DRAINING = ReplicaState.SLEEPING, ReplicaState.DRAINING


@dataclass(frozen=True)
class NextAwake:
    """How a revision gets one more awake replica: `wake` this sleeper (claimed), or wait
    for one on its way to sleep, or (neither) a cold start."""
    wake: Optional[ManagedReplica] = None
    wait: bool = False


@dataclass(frozen=True)
class Sleepers:
    settings: PoolSettings
    registry: Registry
    tier: SleepTier
    stopper: ReplicaStopper
    spawn: Spawn

    def next_awake(self, rev: RevisionState) -> NextAwake:
        """The latest sleeper to fall asleep, its slots claimed back; else a wait while one
        is still on its way to sleep (it is woken once asleep); else a cold start."""
        sleepers = [m for m in rev.in_state(SLEEPING) if m.asleep is not None and not m.stopping]
        if sleepers:
            managed = max(sleepers, key=lambda m: m.asleep.since if m.asleep else 0.0)
            if self.tier.claim(managed):
                return NextAwake(wake=managed)
            self.stop(managed, "its slots were taken while it slept: a cold start instead")
            return NextAwake()
        return NextAwake(wait=any(m.drain_to is SLEEPING for m in rev.in_state(DRAINING)))

    async def put_to_sleep(self, managed: ManagedReplica) -> bool:
        """Drained into sleep, after making room in its node's host-memory budget for
        sleepers; False when it was stopped instead (it could never fit, or sleep failed)."""
        node = managed.placed.node if managed.placed is not None else self.settings.node
        room = make_room(self._all(), node, managed.weight_bytes, self.settings.sleep_host_memory_bytes)
        if room is None:
            await self.stopper.shutdown(managed, reason="too large for the node's host-memory budget "
                                                        "for sleeping replicas")
            return False
        for replica_id in room:
            victim = self.registry.replica(replica_id)
            if victim is not None:
                self.stop(victim, "stopped to make room for a newer sleeper (host-memory budget)")
        return await self._or_stop(self.tier.sleep(managed), managed, "sleep failed")

    async def wake(self, managed: ManagedReplica) -> bool:
        """Awake again; False when the wake failed and it was stopped (a cold start instead)."""
        return await self._or_stop(self.tier.wake(managed), managed, "wake failed, a cold start instead")

    async def _or_stop(self, step: Awaitable[None], managed: ManagedReplica, why: str) -> bool:
        """True when `step` (a sleep or a wake) succeeded; else the replica is stopped."""
        try:
            await step
        except SleepFailed as exc:
            await self.stopper.shutdown(managed, reason=f"{why}: {exc}")
            return False
        return True

    def stop(self, managed: ManagedReplica, reason: str) -> None:
        if managed.state is SLEEPING and not managed.stopping:
            managed.stopping = True             # once: the next tick may name it again
            self.spawn(self.stopper.shutdown(managed, reason=reason))

    def _all(self) -> list[Sleeper]:
        return [Sleeper(m.replica_id, m.asleep.node, m.asleep.host_bytes, m.asleep.since)
                for rev in self.registry.all() for m in rev.in_state(SLEEPING) if m.asleep is not None]
