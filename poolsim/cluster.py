"""The nodes of a simulated pool: their GPU slots and what each reserves, their caches
of weights, their warm standby processes and the host memory of their sleepers.

Bookkeeping only: which replica goes where is pool.admission's and pool.placement's
decision (poolsim/simulator.py asks them over `slot_states`).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from pool.placement import Placed, SlotState
from poolsim.replica_model import GpuKind


@dataclass(frozen=True)
class ClusterShape:
    nodes: int
    gpu: GpuKind
    node_cache_gb: float = 2000.0          # local NVMe kept for weights
    sleep_host_memory_gb: float = 1024.0   # host memory a node's sleepers may take

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpu.gpus_per_node


@dataclass
class NodeCache:
    """Weights kept on a node's disk, least recently used evicted first; entries a live
    replica uses are not evicted."""
    budget_bytes: int
    entries: OrderedDict[str, int] = field(default_factory=OrderedDict)
    users: dict[str, int] = field(default_factory=dict)

    def holds(self, key: str) -> bool:
        return key in self.entries

    def use(self, key: str, nbytes: int) -> None:
        self.entries[key] = nbytes
        self.entries.move_to_end(key)
        self.users[key] = self.users.get(key, 0) + 1
        self._evict()

    def done(self, key: str) -> None:
        left = self.users.get(key, 0) - 1
        if left > 0:
            self.users[key] = left
        else:
            self.users.pop(key, None)

    def forget(self, key: str) -> None:
        """Without a node cache, nothing stays once its last user is done."""
        if key not in self.users:
            self.entries.pop(key, None)

    def _evict(self) -> None:
        total = sum(self.entries.values())
        for key in list(self.entries):
            if total <= self.budget_bytes:
                return
            if key not in self.users:
                total -= self.entries.pop(key)


class Cluster:
    def __init__(self, shape: ClusterShape):
        self.shape = shape
        per_node = shape.gpu.gpus_per_node
        self.nodes = [f"node{n:03d}" for n in range(shape.nodes)]
        self.slot_ids = [f"{node}/gpu{i}" for node in self.nodes for i in range(per_node)]
        self.node_of = {slot: slot.split("/")[0] for slot in self.slot_ids}
        self.reserved: dict[str, int] = {slot: 0 for slot in self.slot_ids}
        self.caches = {node: NodeCache(int(shape.node_cache_gb * 1e9)) for node in self.nodes}
        self.standbys = {node: 0 for node in self.nodes}
        self.busy: dict[str, int] = {slot: 0 for slot in self.slot_ids}   # replicas running requests
        self.load: dict[str, float] = {slot: 0.0 for slot in self.slot_ids}   # expected, by placement
        self.occupied = 0                  # GPUs at least one replica holds now
        self.occupied_seconds = 0.0        # ... integrated up to `occupied_at`
        self.occupied_at = 0.0

    def slot_states(self) -> list[SlotState]:
        memory = self.shape.gpu.memory_bytes
        return [SlotState(slot, self.node_of[slot], memory, self.reserved[slot], load=self.load[slot])
                for slot in self.slot_ids]

    def reserve(self, placed: Placed, now: float, load: float = 0.0) -> None:
        for slot in placed.slot_ids:
            if not self.reserved[slot]:
                self._occupy(now, +1)
            self.reserved[slot] += placed.bytes_per_slot
            self.load[slot] += load

    def release(self, placed: Placed, now: float, load: float = 0.0) -> None:
        for slot in placed.slot_ids:
            self.reserved[slot] -= placed.bytes_per_slot
            self.load[slot] = max(0.0, self.load[slot] - load)
            if not self.reserved[slot]:
                self._occupy(now, -1)

    def _occupy(self, now: float, delta: int) -> None:
        """GPUs occupied, integrated over time: the pool's footprint, however many
        replicas share each GPU."""
        self.occupied_seconds += self.occupied * (now - self.occupied_at)
        self.occupied_at, self.occupied = now, self.occupied + delta

    def nodes_holding(self, key: str) -> frozenset[str]:
        return frozenset(node for node, cache in self.caches.items() if cache.holds(key))

    def gpus_in_use(self) -> int:
        return self.occupied
