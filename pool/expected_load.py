"""How busy a revision's next replica is expected to be: what placement packs by.

By Little's law a revision's requests in flight are its arrival rate times their
time in a replica, so their average over the last few minutes, over what one
replica is sized for (target_concurrency) and over its replicas, is the share of
each replica's capacity, and so of its GPUs, a new replica should expect to use.
The average is exponentially decayed in time (a count that steps up and down as
requests come and go, weighted by how long it held), so an hour-old burst no
longer counts and a steady load does. Pure: times are passed in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

WINDOW_S = 300.0


@dataclass
class InFlightAverage:
    """The time-decayed average of a count that changes at given moments."""
    window_s: float = WINDOW_S
    value: float = 0.0               # the average up to `at`
    count: int = 0                   # the count from `at` on
    at: float = 0.0

    def average(self, now: float) -> float:
        """The count held since `at` pulls the average towards it as time passes."""
        if now <= self.at:
            return self.value
        keep = math.exp(-(now - self.at) / self.window_s)
        return self.count + (self.value - self.count) * keep

    def update(self, now: float, count: int) -> None:
        self.value = self.average(now)
        self.at = max(self.at, now)
        self.count = count


def replica_load(in_flight: float, target_concurrency: int, replicas: int) -> float:
    """The share of its GPUs' compute one of `replicas` replicas is expected to use, 0..1."""
    return min(1.0, in_flight / max(1, target_concurrency) / max(1, replicas))
