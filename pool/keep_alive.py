"""Keep-alive and pre-warm windows learned from a deployment's own idle times: a pure
decision over a histogram.

Shahrad et al. (ATC'20, "Serverless in the Wild") found that a fixed keep-alive
either wastes memory on rarely called functions or cold-starts the regular ones,
and that a histogram of each application's idle times (from the end of one call
to the start of the next) predicts the next call well enough to halve cold starts
at the same memory. Their hybrid policy, which this follows:

  - idle times go into one-minute bins up to four hours;
  - with enough of them, and a histogram that is not flat (the coefficient of
    variation of the bin counts at least 2, i.e. the idle times cluster), the
    window runs from the 5th percentile (less a 10% margin: the pre-warm) to the
    99th (plus 10%: the end of the keep-alive);
  - otherwise (too few idle times, a flat histogram, or most of them beyond the
    range) nothing is learned and the deployment's fixed idle timeout applies.

In the pool (pool/autoscaler.py): while a revision is idle, it wants no replica
before the pre-warm, one from the pre-warm to the end of the window (started
ahead of the call that is likely to come), none after.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class KeepAliveConfig:
    bin_s: float = 60.0
    range_s: float = 4 * 3600.0
    head_percentile: float = 5.0
    tail_percentile: float = 99.0
    margin: float = 0.10
    min_samples: int = 10
    min_cv: float = 2.0              # of the bin counts: below it the idle times do not cluster
    max_out_of_range: float = 0.5    # a larger share of idle times past range_s: nothing learned

    @property
    def bins(self) -> int:
        return math.ceil(self.range_s / self.bin_s)


@dataclass(frozen=True)
class IdleWindow:
    """Seconds from the start of an idle spell: no replica before `prewarm_s`, one from
    there until `until_s`."""
    prewarm_s: float
    until_s: float


@dataclass
class IdleHistogram:
    """A deployment's idle times so far, binned (the books; `learn` decides over them)."""
    config: KeepAliveConfig = KeepAliveConfig()
    counts: list[int] = field(default_factory=list)
    out_of_range: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * self.config.bins

    @property
    def samples(self) -> int:
        return sum(self.counts) + self.out_of_range

    def add(self, idle_s: float) -> None:
        index = int(max(0.0, idle_s) // self.config.bin_s)
        if index < len(self.counts):
            self.counts[index] += 1
        else:
            self.out_of_range += 1


def learn(hist: IdleHistogram) -> Optional[IdleWindow]:
    """The window the histogram supports, or None: the fixed idle timeout applies."""
    cfg = hist.config
    total = hist.samples
    if total < cfg.min_samples or hist.out_of_range > cfg.max_out_of_range * total:
        return None
    if coefficient_of_variation(hist.counts) < cfg.min_cv:
        return None
    head = percentile_bin(hist.counts, cfg.head_percentile) * cfg.bin_s
    tail = (percentile_bin(hist.counts, cfg.tail_percentile) + 1) * cfg.bin_s
    return IdleWindow(prewarm_s=head * (1.0 - cfg.margin), until_s=tail * (1.0 + cfg.margin))


def percentile_bin(counts: list[int], pct: float) -> int:
    """The bin holding the pct-th percentile of the in-range idle times."""
    total = sum(counts)
    wanted = pct / 100.0 * total
    seen = 0
    for index, count in enumerate(counts):
        seen += count
        if count and seen >= wanted:
            return index
    return len(counts) - 1


def coefficient_of_variation(counts: list[int]) -> float:
    n = len(counts)
    mean = sum(counts) / n
    if mean == 0:
        return 0.0
    variance = sum((c - mean) ** 2 for c in counts) / n
    return math.sqrt(variance) / mean


def wants_replica(window: IdleWindow, idle_for_s: float) -> bool:
    """Within the window: a replica kept, or started ahead of the likely call."""
    return window.prewarm_s <= idle_for_s < window.until_s


def next_edge(window: IdleWindow, idle_for_s: float) -> Optional[float]:
    """Seconds of idleness at which `wants_replica` next changes, or None."""
    for edge in (window.prewarm_s, window.until_s):
        if idle_for_s < edge:
            return edge
    return None
