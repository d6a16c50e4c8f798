"""Which adapters sit in the device's adapter slots: pure bookkeeping for the scheduler.

An adapter is placed in a slot when a request for it is admitted: the slot it already
has, else a free one, else the least recently used adapter's whose requests have all
left (pinned adapters, those with a running request, never move). None when every slot
is pinned: the request waits. A placement that needs the adapter's weights copied into
the slot is reported, and the engine copies them before the step runs.
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from typing import Optional


class AdapterSlots:
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self.slot_of: "OrderedDict[str, int]" = OrderedDict()   # least recently used first
        self.pins: Counter[str] = Counter()

    def place(self, name: str) -> Optional[tuple[int, bool]]:
        """(slot, whether its weights must be loaded) for a request of `name`; None: no slot."""
        if name in self.slot_of:
            self.slot_of.move_to_end(name)
            return self.slot_of[name], False
        taken = set(self.slot_of.values())
        free = next((s for s in range(self.num_slots) if s not in taken), None)
        if free is None:
            victim = next((n for n in self.slot_of if not self.pins[n]), None)
            if victim is None:
                return None
            free = self.slot_of.pop(victim)
        self.slot_of[name] = free
        return free, True

    def pin(self, name: str) -> None:
        self.pins[name] += 1

    def unpin(self, name: str) -> None:
        self.pins[name] -= 1
        if self.pins[name] <= 0:
            del self.pins[name]

    def forget(self, name: str) -> bool:
        """Drop `name` from its slot (the adapter was removed); False while it is pinned."""
        if self.pins[name]:
            return False
        self.slot_of.pop(name, None)
        return True
