"""The operator's cost book as pure Decimal functions: what one GPU-second costs the
platform, per GPU kind (what a tenant pays for it is the price book's, pricing.py).

A row prices one GPU kind (what the pool's slots report, pool.api.ReplicaEvent.gpu_kind:
a GPU's type such as `h100`, `cuda` for a GPU of no known type, `cpu`) or, with no kind,
every kind that has no row of its own in effect: the default (seeded from
THAWPOOL_GPU_COST_PER_SECOND, and the cost of GPU time whose kind is unknown). A `cuda`
row also prices every GPU type without a row of its own, over the default: a book
written when every GPU was `cuda` keeps pricing them. Each row is in effect from its
`effective_from` on; at any instant the most specific kind's latest row in effect
applies (the type's, then `cuda`'s, then the default's). GPU time is
costed second by second, as GPU-second prices are: a span is cut where the row that
applies changes, and a piece before any row is in effect costs nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Optional, Sequence

from controlplane.billing.pricing import Pricing, exact_seconds, gpu_cost


@dataclass(frozen=True)
class CostRow:
    gpu_kind: Optional[str]           # None: the default, for kinds without a row of their own
    effective_from: datetime
    per_gpu_second: Decimal


ANY_GPU = "cuda"                      # a GPU of no known type; its rows price every type without its own
NOT_GPU_TYPES = frozenset({"cpu", ANY_GPU})   # kinds that no `cuda` row stands in for


def for_kind(rows: Sequence[CostRow], kind: Optional[str]) -> list[CostRow]:
    """The rows that can cost GPU time of `kind` (None: unknown): its own, `cuda`'s where
    it is a GPU type, and the default's."""
    gpu_type = kind is not None and kind not in NOT_GPU_TYPES
    return [r for r in rows if r.gpu_kind is None or r.gpu_kind == kind or (gpu_type and r.gpu_kind == ANY_GPU)]


def cost_at(rows: Sequence[CostRow], at: datetime) -> Optional[CostRow]:
    """Of one kind's rows (`for_kind`), the one that applies at `at`: the most specific
    kind's latest in effect."""
    live = [r for r in rows if r.effective_from <= at]
    return max(live, key=lambda r: (_specificity(r), r.effective_from), default=None)


def _specificity(row: CostRow) -> int:
    """Of one kind's rows: the default 0, `cuda`'s 1, the kind's own 2 (`cuda`'s own rows
    rank 1 and meet only the default)."""
    if row.gpu_kind is None:
        return 0
    return 1 if row.gpu_kind == ANY_GPU else 2


def cost_between(rows: Sequence[CostRow], start: datetime, end: datetime,
                 gpu_count: int) -> Decimal:
    """What `gpu_count` GPUs held over [start, end) cost, each second at the row of one
    kind's rows (`for_kind`) that applied then."""
    if end <= start:
        return Decimal(0)
    cuts = sorted({start, end, *(r.effective_from for r in rows if start < r.effective_from < end)})
    total = Decimal(0)
    for piece_start, piece_end in zip(cuts, cuts[1:]):
        row = cost_at(rows, piece_start)
        if row is not None:
            held = exact_seconds(piece_end - piece_start) * gpu_count
            total += gpu_cost(Pricing(gpu_second=row.per_gpu_second), held)
    return total
