"""The simulated clock: a heap of timed callbacks, run in time order.

Why not simpy: every decision the simulator runs is a pure function of `now`
(pool/autoscaler.py and the rest take the time as an argument), so no process
needs to be suspended and resumed; a callback heap is all the clock must be.
On this machine it costs about 2 us an event against simpy's 3 us with
callbacks and 10 us with a process per request (benchmarks/event_loop.py),
and a simulated day of a large pool is tens of millions of events.
"""
from __future__ import annotations

import heapq
import itertools
from typing import Any, Callable


class Timer:
    """A scheduled callback; `cancel` keeps it from running."""
    __slots__ = ("at", "cancelled")

    def __init__(self, at: float):
        self.at = at
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Timer, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()        # ties run in the order they were scheduled
        self.events_run = 0

    def at(self, when: float, fn: Callable[..., None], *args: Any) -> Timer:
        """Run fn(*args) at `when` (at once if that has passed)."""
        timer = Timer(max(when, self.now))
        heapq.heappush(self._heap, (timer.at, next(self._seq), timer, fn, args))
        return timer

    def after(self, delay_s: float, fn: Callable[..., None], *args: Any) -> Timer:
        return self.at(self.now + delay_s, fn, *args)

    def run(self, until: float) -> None:
        """Run every callback due before `until`, then stop the clock there."""
        heap = self._heap
        while heap and heap[0][0] < until:
            when, _, timer, fn, args = heapq.heappop(heap)
            if timer.cancelled:
                continue
            self.now = when
            self.events_run += 1
            fn(*args)
        self.now = max(self.now, until)

    def pending(self) -> int:
        return sum(1 for entry in self._heap if not entry[2].cancelled)
