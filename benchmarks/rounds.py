"""Repeated measurements: every round kept and shown, the median reported.

A benchmark repeats its peers over rounds (alternating, so that load drift hits them
all) and reports the median round of each, never the best: the best of a few rounds
is the luckiest one, and a ratio of two luckiest rounds says more about the luck than
about the code. The rounds themselves are printed beside the median, so a reader sees
the spread.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")


def alternating_times(fns: Mapping[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Seconds of every call of each, `rounds` times, the candidates alternating; one
    warm-up call of each first (a kernel built on first use is not timed)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def medians(rounds: Mapping[str, Sequence[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in rounds.items()}


def median_round(rounds: Sequence[T], key: Callable[[T], float]) -> T:
    """The round whose `key` is the median (the lower middle one of an even count, so
    an odd count is the fair one): a round as measured, its stages consistent."""
    ordered = sorted(rounds, key=key)
    return ordered[(len(ordered) - 1) // 2]


def shown(values: Sequence[float], scale: float = 1.0, digits: int = 3) -> str:
    """`median m (rounds a, b, c)`, each value times `scale`."""
    rounds = ", ".join(f"{v * scale:.{digits}f}" for v in values)
    return f"median {statistics.median(values) * scale:.{digits}f} (rounds {rounds})"
