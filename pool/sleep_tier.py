"""The sleep tier's I/O: a replica put to sleep and woken through the runtime's /sleep
and /wake (runtime/core/sleep_mode.py; their answers are wire/replica_control.py's), with
the books kept in step.

  sleep   draining -> sleeping once the replica says its device memory is free: only
          then are its slots released (the `sleeping` event carries none, so its GPU
          time ends there); what it needs to wake is kept in `ManagedReplica.asleep`
  claim   sleeping -> waking when its own slots are free now (its process is bound to
          them) and its tenant's quota allows: the `waking` event carries them again
  wake    the replica's weights back on the device; its stages become the wake record

Which replica sleeps, wakes or stops is the manager's (the autoscaler's `Decision`,
pool/sleep_budget.py); a failure here raises `SleepFailed` and the manager stops the
replica (a failed wake falls back to a cold start).
"""
from __future__ import annotations

from typing import Any, Optional

import httpx

from pool.api import RevisionSpec
from pool.backends.base import Backend, ReplicaHandle
from pool.capacity import Capacity
from pool.clock import Clock
from pool.placement import PlacementRequest
from pool.registry import Asleep, ManagedReplica
from pool.replica import ReplicaState
from pool.replica_events import ReplicaEvents
from pool.settings import PoolSettings
from wire.replica_control import SLEEP_PATH, WAKE_PATH, SleepReply, WakeReply


class SleepFailed(Exception):
    """The replica did not sleep or wake: it is stopped."""


class SleepTier:
    def __init__(self, settings: PoolSettings, backend: Backend, capacity: Capacity,
                 events: ReplicaEvents, http: httpx.AsyncClient, clock: Clock):
        self.settings = settings
        self.backend = backend
        self.capacity = capacity
        self.events = events
        self.http = http
        self.clock = clock

    def can_sleep(self, spec: RevisionSpec) -> bool:
        """A model (a function replica is stopped), with a sleep tier, on a backend whose
        sleeping replicas give their GPUs back."""
        return spec.kind == "model" and spec.sleep_timeout_s > 0 and self.backend.can_sleep

    async def sleep(self, managed: ManagedReplica) -> None:
        placed, handle = managed.placed, managed.handle
        if placed is None or handle is None:
            raise SleepFailed("it holds no slots")
        reply = SleepReply.parse(await self._post(handle, SLEEP_PATH))
        managed.asleep = Asleep(placed.node, placed.slot_ids, placed.bytes_per_slot,
                                self._host_bytes(reply.host_bytes, managed.weight_bytes),
                                self.clock.mono())
        managed.placed, managed.replica.slot_ids = None, ()
        self.events.move(managed, ReplicaState.SLEEPING)
        await self.capacity.release(managed.replica_id, placed.slot_ids)

    def claim(self, managed: ManagedReplica) -> bool:
        """Waking, on its own slots, if it can have them now."""
        asleep = managed.asleep
        if asleep is None:
            return False
        request = PlacementRequest(asleep.bytes_per_slot, len(asleep.slot_ids), on_slots=asleep.slot_ids)
        placed = self.capacity.claim(managed.replica_id, managed.spec.tenant_id, request)
        if placed is None:
            return False
        managed.placed, managed.asleep, managed.replica.slot_ids = placed, None, placed.slot_ids
        self.events.move(managed, ReplicaState.WAKING)
        return True

    async def wake(self, managed: ManagedReplica) -> None:
        if managed.handle is None:
            raise SleepFailed("it has no process")
        reply = WakeReply.parse(await self._post(managed.handle, WAKE_PATH))
        managed.replica.wake_stages = dict(reply.wake_timings)

    def _host_bytes(self, reported: Optional[int], weight_bytes: int) -> int:
        """The host memory a sleeper is counted for in its node's budget: what it reports,
        if a counter up to the room made for it (its weights' size, or the whole budget
        when that is unknown); its weights' size otherwise. A sleeper that claimed more
        would have the budget stop other tenants' sleepers to make room for it."""
        limit = weight_bytes or self.settings.sleep_host_memory_bytes
        return reported if reported is not None and reported <= limit else weight_bytes

    async def _post(self, handle: ReplicaHandle, path: str) -> dict[str, Any]:
        if not handle.is_alive():
            raise SleepFailed(f"{path}: {handle.exit_reason() or 'its process is gone'}")
        try:
            resp = await self.http.post(f"{handle.base_url}{path}", headers=handle.headers,
                                        timeout=self.settings.sleep_call_timeout_s)
            body: Optional[Any] = resp.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise SleepFailed(f"{path}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code != 200 or not isinstance(body, dict):
            raise SleepFailed(f"{path} answered {resp.status_code}: {resp.text[:200]}")
        return body
