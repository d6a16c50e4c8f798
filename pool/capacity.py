"""Capacity: the slots the pool may place on, what each replica reserves of them, and
the replicas waiting for slots.

Which waiting replica gets slots is a pure decision (pool.admission.admit over
`states()`: fair across tenants, within their GPU quotas; placement.place for
where); this module keeps the books it decides over and runs it whenever they
change: a replica asks (`place`), one lets go of its slots, a node joins or
leaves, the quotas change. A replica adopted after a restart is booked as it
is (`hold`), before any replica is placed. A waiting replica learns why it waits through its
`on_wait` callback. Slots may leave (a node of a cluster goes away): their
reservations go with them, and a replica placed there finds out when it asks
for its slots.
"""
from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Callable, Collection, Mapping, Optional, Sequence

from pool.admission import Pending, WaitReason, admit
from pool.api import ColdStartFailed, ModelInfo, ReplicaShape, TenantQuota
from pool.inventory import Slot
from pool.placement import Placed, PlacementRequest, SlotState, never_fits, request_for
from pool.settings import PoolSettings


@dataclass
class Asking:
    """A replica waiting in `Capacity.place`."""
    pending: Pending
    granted: asyncio.Future[Placed]
    on_wait: Callable[[WaitReason], None]


class Capacity:
    def __init__(self, settings: PoolSettings):
        self.settings = settings
        self._slots: list[Slot] = []
        self._reserved: dict[str, dict[str, int]] = {}      # slot_id -> {replica_id: bytes}
        self._tenant_of: dict[str, str] = {}                # replica_id -> tenant, while it holds slots
        self._load: dict[str, float] = {}                   # replica_id -> its expected load, placed by
        self._quotas: dict[str, TenantQuota] = {}
        self._asking: dict[str, Asking] = {}                # replica_id -> its wait for slots
        self._arrivals = itertools.count()

    @property
    def slots(self) -> list[Slot]:
        return list(self._slots)

    async def update(self, fresh: Sequence[Slot]) -> tuple[list[Slot], list[Slot]]:
        """Take a new list of slots; returns (added, removed); waiting replicas may now fit."""
        added, removed = slot_changes(self._slots, fresh)
        self._slots = list(fresh)
        for gone in removed:
            self._reserved.pop(gone.slot_id, None)
        for new in added:
            self._reserved.setdefault(new.slot_id, {})
        self._admit()
        return added, removed

    def set_quotas(self, quotas: Mapping[str, TenantQuota]) -> None:
        """Each tenant's quota as the desired state says now (a raised quota may place some)."""
        self._quotas = dict(quotas)
        self._admit()

    def states(self) -> list[SlotState]:
        return [SlotState(s.slot_id, s.node, s.memory_bytes, reserved_bytes(s, self._reserved[s.slot_id]),
                          s.exclusive, sum(self._load.get(r, 0.0) for r in self._reserved[s.slot_id]))
                for s in self._slots]

    def gpus_held(self) -> dict[str, int]:
        """Slots reserved per tenant (a replica on two slots holds two)."""
        held: dict[str, int] = {}
        for holders in self._reserved.values():
            for replica_id in holders:
                tenant = self._tenant_of.get(replica_id, "")
                held[tenant] = held.get(tenant, 0) + 1
        return held

    def request(self, info: ModelInfo, shape: ReplicaShape, draft: Optional[ModelInfo] = None) -> PlacementRequest:
        return request_for(info, shape.gpu_memory_gb, shape.gpu_count, shape.engine,
                           self.settings.kv_cache_tokens_default, self.settings.memory_overhead_fraction, draft)

    def never_fits(self, request: PlacementRequest) -> Optional[str]:
        """Why no state of these slots could ever hold the request, or None."""
        return never_fits(request, self.states())

    async def place(self, replica_id: str, tenant_id: str, request: PlacementRequest,
                    preferred: Collection[str], on_wait: Callable[[WaitReason], None]) -> Placed:
        """Reserve slots for the replica, waiting (in the fair order) until it gets them."""
        granted: asyncio.Future[Placed] = asyncio.get_running_loop().create_future()
        pending = Pending(replica_id, tenant_id, request, next(self._arrivals), frozenset(preferred))
        self._asking[replica_id] = Asking(pending, granted, on_wait)
        self._admit()
        try:
            return await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():    # granted just as the wait ended
                await self.release(replica_id, granted.result().slot_ids)
            raise
        finally:
            self._asking.pop(replica_id, None)

    def claim(self, replica_id: str, tenant_id: str, request: PlacementRequest) -> Optional[Placed]:
        """Reserve slots for the replica now, or None when they are not free now or its
        tenant is at its GPU quota; never waits (a sleeper waking on its own slots: when
        it cannot have them, a cold start elsewhere is the better wait)."""
        pending = Pending(replica_id, tenant_id, request, next(self._arrivals), frozenset())
        decision = admit([pending], self.states(), self.gpus_held(), self._quotas)
        if not decision.placed:
            return None
        where = decision.placed[0][1]
        self._book(replica_id, tenant_id, where, request.load)
        return where

    def hold(self, replica_id: str, tenant_id: str, node: str, slot_ids: Sequence[str],
             bytes_per_slot: Optional[int]) -> Placed:
        """Book slots for a replica that already runs on them (adopted after a restart), no
        decision asked; bytes_per_slot None: it is booked as holding the whole slots."""
        known = {s.slot_id: s for s in self.slots_for(slot_ids)}
        for sid in slot_ids:
            self._reserved[sid][replica_id] = known[sid].memory_bytes if bytes_per_slot is None else bytes_per_slot
        self._tenant_of[replica_id] = tenant_id
        booked = max(self._reserved[sid][replica_id] for sid in slot_ids)
        return Placed(node, tuple(slot_ids), booked)

    async def release(self, replica_id: str, slot_ids: Sequence[str]) -> None:
        for sid in slot_ids:
            self._reserved.get(sid, {}).pop(replica_id, None)      # its node may have left
        self._tenant_of.pop(replica_id, None)
        self._load.pop(replica_id, None)
        self._admit()

    def slots_for(self, slot_ids: Sequence[str]) -> list[Slot]:
        """The slots a replica was placed on; ColdStartFailed if one has left since."""
        known = {s.slot_id: s for s in self._slots}
        missing = [sid for sid in slot_ids if sid not in known]
        if missing:
            raise ColdStartFailed(f"slot(s) {', '.join(missing)} left the pool before the replica started")
        return [known[sid] for sid in slot_ids]

    def kind_of(self, slot_ids: Sequence[str]) -> Optional[str]:
        """What the cost book prices these slots as (Slot.cost_kind: one node's, so one
        kind), or None when none of them is in the pool any more or they differ."""
        kinds = {s.cost_kind for s in self._slots if s.slot_id in slot_ids}
        return kinds.pop() if len(kinds) == 1 else None

    def _admit(self) -> None:
        """Run the decision over the books now and act on it: reserve and wake who was
        placed, tell the others why they wait."""
        waiting = [a for a in self._asking.values() if not a.granted.done()]
        if not waiting:
            return
        decision = admit([a.pending for a in waiting], self.states(), self.gpus_held(), self._quotas)
        for replica_id, where in decision.placed:
            asking = self._asking[replica_id]
            self._book(replica_id, asking.pending.tenant_id, where, asking.pending.request.load)
            asking.granted.set_result(where)
        for replica_id, why in decision.waiting.items():
            self._asking[replica_id].on_wait(why)

    def _book(self, replica_id: str, tenant_id: str, where: Placed, load: float) -> None:
        for sid in where.slot_ids:
            self._reserved[sid][replica_id] = where.bytes_per_slot
        self._tenant_of[replica_id] = tenant_id
        if load:
            self._load[replica_id] = load


def reserved_bytes(slot: Slot, held: Mapping[str, int]) -> int:
    """Memory taken on a slot; an exclusive slot (a whole Ray GPU) is full once anyone holds it."""
    if slot.exclusive and held:
        return slot.memory_bytes
    return sum(held.values())


def slot_changes(current: Sequence[Slot], fresh: Sequence[Slot]) -> tuple[list[Slot], list[Slot]]:
    """(slots in fresh but not current, slots in current but not fresh), by slot id."""
    before, after = {s.slot_id for s in current}, {s.slot_id for s in fresh}
    return [s for s in fresh if s.slot_id not in before], [s for s in current if s.slot_id not in after]
