"""Capacity: the slots the pool may place on and what each replica reserves of them.

The decision of where a replica goes is pure (pool.placement over
`states()`); this module keeps the books it decides over, and a wake-up for
cold starts that wait for room: a replica that lets go of its slots, or a
node that joins, notifies them. Slots may leave (a node of a cluster goes
away): their reservations go with them, and a replica placed there finds
out when it asks for its slots.
"""
from __future__ import annotations

import asyncio
from typing import Collection, Mapping, Optional, Sequence

from pool.api import ColdStartFailed, ModelInfo, ReplicaShape
from pool.inventory import Slot
from pool.placement import Decision, Placed, PlacementRequest, SlotState, never_fits, place, request_for
from pool.settings import PoolSettings


class Capacity:
    def __init__(self, settings: PoolSettings):
        self.settings = settings
        self._slots: list[Slot] = []
        self._reserved: dict[str, dict[str, int]] = {}      # slot_id -> {replica_id: bytes}
        self._changed = asyncio.Condition()

    @property
    def slots(self) -> list[Slot]:
        return list(self._slots)

    async def update(self, fresh: Sequence[Slot]) -> tuple[list[Slot], list[Slot]]:
        """Take a new list of slots; returns (added, removed) and wakes waiters if any joined."""
        added, removed = slot_changes(self._slots, fresh)
        self._slots = list(fresh)
        for gone in removed:
            self._reserved.pop(gone.slot_id, None)
        for new in added:
            self._reserved.setdefault(new.slot_id, {})
        if added:
            await self._wake()
        return added, removed

    def states(self) -> list[SlotState]:
        return [SlotState(s.slot_id, s.node, s.memory_bytes, reserved_bytes(s, self._reserved[s.slot_id]))
                for s in self._slots]

    def request(self, info: ModelInfo, shape: ReplicaShape) -> PlacementRequest:
        return request_for(info, shape.gpu_memory_gb, shape.gpu_count, shape.engine,
                           self.settings.kv_cache_tokens_default, self.settings.memory_overhead_fraction)

    def never_fits(self, request: PlacementRequest) -> Optional[str]:
        """Why no state of these slots could ever hold the request, or None."""
        return never_fits(request, self.states())

    def try_place(self, replica_id: str, request: PlacementRequest, preferred: Collection[str]) -> Decision:
        """Place now if there is room, and reserve what was placed."""
        decision = place(request, self.states(), preferred)
        if isinstance(decision, Placed):
            for sid in decision.slot_ids:
                self._reserved[sid][replica_id] = decision.bytes_per_slot
        return decision

    async def release(self, replica_id: str, slot_ids: Sequence[str]) -> None:
        for sid in slot_ids:
            self._reserved.get(sid, {}).pop(replica_id, None)      # its node may have left
        await self._wake()

    def slots_for(self, slot_ids: Sequence[str]) -> list[Slot]:
        """The slots a replica was placed on; ColdStartFailed if one has left since."""
        known = {s.slot_id: s for s in self._slots}
        missing = [sid for sid in slot_ids if sid not in known]
        if missing:
            raise ColdStartFailed(f"slot(s) {', '.join(missing)} left the pool before the replica started")
        return [known[sid] for sid in slot_ids]

    async def wait_for_room(self, timeout_s: float) -> None:
        """Until slots are released or added, or timeout_s (then the caller looks again)."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass

    async def _wake(self) -> None:
        async with self._changed:
            self._changed.notify_all()


def reserved_bytes(slot: Slot, held: Mapping[str, int]) -> int:
    """Memory taken on a slot; an exclusive slot (a whole Ray GPU) is full once anyone holds it."""
    if slot.exclusive and held:
        return slot.memory_bytes
    return sum(held.values())


def slot_changes(current: Sequence[Slot], fresh: Sequence[Slot]) -> tuple[list[Slot], list[Slot]]:
    """(slots in fresh but not current, slots in current but not fresh), by slot id."""
    before, after = {s.slot_id for s in current}, {s.slot_id for s in fresh}
    return [s for s in fresh if s.slot_id not in before], [s for s in current if s.slot_id not in after]
