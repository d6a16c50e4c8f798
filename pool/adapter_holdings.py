"""Which LoRA adapters one replica holds: pure bookkeeping for the pool.

A replica's engine keeps every adapter it was given in host memory and swaps them
into its device slots itself (runtime/lora/slots.py); the pool bounds how many it is
given (a capacity, the pool's settings) and takes back the least recently used one, never one a request
holds a lease for, to make room. What the router reads: whether a replica holds an
adapter. No I/O and no clock here; pool/adapter_loads.py acts on it.
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field


@dataclass
class AdapterHoldings:
    loaded: "OrderedDict[str, int]" = field(default_factory=OrderedDict)   # name -> bytes, LRU first
    users: Counter[str] = field(default_factory=Counter)                  # leases using each

    def holds(self, name: str) -> bool:
        return name in self.loaded

    def use(self, name: str) -> None:
        """A lease runs with `name` from now on: most recently used, not evictable."""
        self.users[name] += 1
        if name in self.loaded:
            self.loaded.move_to_end(name)

    def done(self, name: str) -> None:
        self.users[name] -= 1
        if self.users[name] <= 0:
            del self.users[name]

    def to_evict(self, incoming: str, capacity: int) -> list[str]:
        """The least recently used adapters no lease uses, enough to make room for
        `incoming` (fewer when too many are in use: the engine holds them meanwhile)."""
        excess = len(self.loaded) + (incoming not in self.loaded) - capacity
        idle = [n for n in self.loaded if n != incoming and not self.users[n]]
        return idle[:max(0, excess)]

    def added(self, name: str, nbytes: int) -> None:
        self.loaded[name] = nbytes
        self.loaded.move_to_end(name)

    def dropped(self, name: str) -> None:
        self.loaded.pop(name, None)
