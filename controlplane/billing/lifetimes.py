"""GPU time of replica lifetimes, as pure functions over plain data (no clock, no database).

The billing rule (pool.api.ReplicaEventSink): a lifetime is billed from the first
event that carried slot ids (`placed_at`: the replica holds its GPUs) to its recorded
stop, or, while no stop was recorded, up to the last event or heartbeat that saw it
(`last_seen_at`), never to "now". A replica that waited for capacity bills nothing
for the wait; one lost in a crash bills up to the last heartbeat that saw it. A
replica of the sleep tier bills nothing while asleep: its `sleeps` (when it fell
asleep and when it woke, in turn) cut the held span into the billed spans (`billed`),
each ending at the event that gave its slots back and each after the first starting
at the wake that took them again.

Report rows group GPU time like usage rows: by UTC day (a lifetime is cut at
midnight), or by a label the lifetime carries (deployment, model, revision). Each
piece is priced second by second at the price in effect then (`pricing.gpu_cost_between`).

By adapter, a replica's GPU time inside the window is shared out among what ran on it
(the base model, each adapter) in proportion to their tokens (`gpu_by_share`), the way a
function's batch is shared among its calls; the shares of one lifetime add up to its
seconds and cost exactly, so every grouping has the same totals.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, time, timedelta, timezone
from decimal import ROUND_DOWN, Decimal, localcontext
from typing import Iterable, Mapping, Optional, Sequence

from controlplane.billing.pricing import MONEY_QUANTUM, PriceRow, gpu_cost_between

Span = tuple[datetime, datetime]
SECONDS_QUANTUM = Decimal("0.000001")       # lifetimes are stamped to the microsecond


@dataclass(frozen=True)
class Window:
    start: datetime     # inclusive, UTC
    end: datetime       # exclusive, UTC


@dataclass(frozen=True)
class Lifetime:
    deployment_id: str
    gpu_count: int
    placed_at: Optional[datetime]
    stopped_at: Optional[datetime]
    last_seen_at: Optional[datetime]
    label: str = ""                 # the report row it belongs to (not by day)
    sleeps: tuple[datetime, ...] = ()   # fell asleep, woke, fell asleep, ... (odd: asleep now)
    replica_id: str = ""


@dataclass(frozen=True)
class GpuUse:
    seconds: Decimal = Decimal(0)
    cost: Decimal = Decimal(0)

    def __add__(self, other: "GpuUse") -> "GpuUse":
        return GpuUse(self.seconds + other.seconds, self.cost + other.cost)


def held(lifetime: Lifetime) -> Optional[Span]:
    """[placed, end) as far as it is recorded; None for a replica that never held GPUs."""
    placed = lifetime.placed_at
    if placed is None:
        return None
    end = lifetime.stopped_at or lifetime.last_seen_at or placed
    return placed, max(end, placed)


def billed(lifetime: Lifetime) -> list[Span]:
    """The held span without the times the replica slept: each [woke, fell asleep)."""
    span = held(lifetime)
    if span is None:
        return []
    start, end = span
    marks = list(lifetime.sleeps)
    spans = []
    for slept, woke in zip(marks[0::2], marks[1::2] + [end]):
        if min(slept, end) > start:
            spans.append((start, min(slept, end)))
        start = max(start, woke)
    if not len(marks) % 2 and end > start:
        spans.append((start, end))
    return spans


def clipped(span: Span, window: Window) -> Optional[Span]:
    start, end = max(span[0], window.start), min(span[1], window.end)
    return (start, end) if start < end else None


def utc_days(span: Span) -> list[tuple[str, Span]]:
    """The span cut at UTC midnights, each piece with its date (YYYY-MM-DD)."""
    pieces, start = [], span[0].astimezone(timezone.utc)
    end = span[1].astimezone(timezone.utc)
    while start < end:
        midnight = datetime.combine(start.date() + timedelta(days=1), time(), timezone.utc)
        piece_end = min(end, midnight)
        pieces.append((start.date().isoformat(), (start, piece_end)))
        start = piece_end
    return pieces


def gpu_by_key(lifetimes: Iterable[Lifetime], timelines: Mapping[str, Sequence[PriceRow]],
               window: Window, by_day: bool) -> dict[str, GpuUse]:
    """GPU-seconds and their cost inside the window, per report key: the UTC date of each
    piece (`by_day`) or the lifetime's label. `timelines` holds each deployment's price rows."""
    rows: dict[str, GpuUse] = {}
    for lifetime in lifetimes:
        timeline = timelines.get(lifetime.deployment_id, ())
        for span in billed(lifetime):
            inside = clipped(span, window)
            if inside is None:
                continue
            pieces = utc_days(inside) if by_day else [(lifetime.label, inside)]
            for key, (start, end) in pieces:
                seconds, cost = gpu_cost_between(timeline, start, end, lifetime.gpu_count)
                rows[key] = rows.get(key, GpuUse()) + GpuUse(seconds, cost)
    return rows


def gpu_by_share(lifetimes: Iterable[Lifetime], timelines: Mapping[str, Sequence[PriceRow]],
                 window: Window, weights: Mapping[str, Mapping[str, int]]) -> dict[str, GpuUse]:
    """GPU-seconds and their cost inside the window, each lifetime's split among the keys
    of its replica's `weights` (tokens by report key); a lifetime with no weight keeps all
    of it under its label."""
    rows: dict[str, GpuUse] = {}
    for lifetime in lifetimes:
        held_inside = gpu_by_key([lifetime], timelines, window, by_day=False)
        if not held_inside:
            continue
        use = held_inside[lifetime.label]
        for key, part in split(use, weights.get(lifetime.replica_id, {}), lifetime.label).items():
            rows[key] = rows.get(key, GpuUse()) + part
    return rows


def split(use: GpuUse, weights: Mapping[str, int], fallback: str) -> dict[str, GpuUse]:
    """`use` in proportion to `weights`, seconds to the microsecond and cost to the money
    quantum, each rounded down; what rounding left goes to the largest share, so the
    shares add up to `use` exactly. No positive weight: all of it to `fallback`."""
    positive = {key: weight for key, weight in weights.items() if weight > 0}
    total = sum(positive.values())
    if not total:
        return {fallback: use}
    parts = {key: GpuUse(_share(use.seconds, weight, total, SECONDS_QUANTUM),
                         _share(use.cost, weight, total, MONEY_QUANTUM))
             for key, weight in positive.items()}
    largest = max(positive, key=lambda key: (positive[key], key))
    given = sum(parts.values(), GpuUse())
    parts[largest] += GpuUse(use.seconds - given.seconds, use.cost - given.cost)
    return parts


def _share(amount: Decimal, weight: int, total: int, quantum: Decimal) -> Decimal:
    with localcontext() as ctx:
        ctx.prec = 60       # the product exact, the quotient rounded down from its true value
        return (amount * weight / total).quantize(quantum, rounding=ROUND_DOWN)
