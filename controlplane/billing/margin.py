"""The margin of serving, as pure functions over plain data (no clock, no database): for
a group of calls and replicas, what the tenants were billed, what the GPU time cost the
platform, and what drives that cost. docs/margin.md defines each figure for operators.

- revenue: what the bills say, as the billing report computes it (controlplane.store.
  billing): token revenue (the usage rows' cost: tokens and per-call prices) plus GPU
  revenue (GPU-seconds at the price book);
- GPU cost: each lifetime's billed spans inside the window (GPUs held and not asleep:
  lifetimes.billed) x its GPUs, each second at the cost book's cost then for the
  lifetime's GPU kind (costs.py; an unknown kind at the default);
- margin = revenue - GPU cost, margin % = margin / revenue;
- idle GPU-seconds: held GPU-seconds in which the replica ran no call. A call runs on
  its replica from its start plus its queue wait (which holds any cold start) to its
  finish (usage rows' started_at + queue_s to finished_at), whichever tenant made it: a
  shared base serves several;
- asleep GPU-seconds: the lifetime's span (placement to its end, lifetimes.held) inside
  the window less its billed spans, x GPUs; sleep share = asleep / (held + asleep);
- mean batch size: replicas report no batch sizes, so it is the mean number of calls in
  flight on a replica while it ran any: the calls' seconds (clipped to the billed
  spans) over the seconds in which at least one ran;
- cache hit rate: cached / prompt tokens; cost per 1,000 tokens: GPU cost per 1,000
  prompt + completion tokens of the group's usage rows.

Rows and totals keep sums; every ratio is taken from a row's (or the totals') sums,
never as a mean of ratios, so the totals' ratios are the whole's.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from decimal import Decimal, localcontext
from typing import Any, Iterable, Mapping, Optional, Sequence

from controlplane.billing.costs import CostRow, cost_between, for_kind
from controlplane.billing.lifetimes import (SECONDS_QUANTUM, Lifetime, Span, Window, billed,
                                            clipped, held)
from controlplane.billing.pricing import MONEY_QUANTUM, exact_seconds

RATIO_QUANTUM = Decimal("0.000001")
PERCENT_QUANTUM = Decimal("0.01")
UNKNOWN_KIND = "unknown"            # a lifetime recorded before its kind was (migration 0017)


@dataclass(frozen=True)
class Revenue:
    """What a group's bills say (the billing report's rows)."""
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    token_revenue: Decimal = Decimal(0)      # tokens and per-call prices
    gpu_revenue: Decimal = Decimal(0)        # GPU-seconds at the price book

    @property
    def total(self) -> Decimal:
        return self.token_revenue + self.gpu_revenue

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: "Revenue") -> "Revenue":
        return Revenue(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(Revenue)))


@dataclass(frozen=True)
class ReplicaLife:
    """A lifetime with what costs it and what it ran."""
    lifetime: Lifetime
    gpu_kind: Optional[str]                  # None: not recorded
    quantization: str                        # quantization_of its revision


@dataclass(frozen=True)
class Serving:
    """What a group's replicas cost and how they spent their time (sums)."""
    gpu_seconds: Decimal = Decimal(0)        # held, not asleep: the GPU-seconds billed
    idle_gpu_seconds: Decimal = Decimal(0)
    asleep_gpu_seconds: Decimal = Decimal(0)
    busy_seconds: Decimal = Decimal(0)       # wall seconds with at least one call running
    call_seconds: Decimal = Decimal(0)       # the calls' own seconds, summed
    gpu_cost: Decimal = Decimal(0)
    gpu_kinds: frozenset[str] = field(default_factory=frozenset)
    quantizations: frozenset[str] = field(default_factory=frozenset)

    def __add__(self, other: "Serving") -> "Serving":
        return Serving(
            self.gpu_seconds + other.gpu_seconds, self.idle_gpu_seconds + other.idle_gpu_seconds,
            self.asleep_gpu_seconds + other.asleep_gpu_seconds,
            self.busy_seconds + other.busy_seconds, self.call_seconds + other.call_seconds,
            self.gpu_cost + other.gpu_cost, self.gpu_kinds | other.gpu_kinds,
            self.quantizations | other.quantizations)


def quantization_of(engine: Mapping[str, Any], weights: Optional[Mapping[str, Any]]) -> str:
    """The engine's quantization (`int8`), else a quantized checkpoint's format (`gguf`,
    `awq`: revisions.weights), else `none`."""
    chosen = engine.get("quantization")
    if chosen:
        return str(chosen)
    return str((weights or {}).get("format") or "none")


def serving(life: ReplicaLife, calls: Sequence[Span], book: Sequence[CostRow],
            window: Window) -> Serving:
    """One lifetime's share of the window: its cost, held, idle and asleep GPU-seconds,
    and the seconds its calls ran (`calls`: its calls' [start, finish) spans)."""
    lifetime, gpus = life.lifetime, life.lifetime.gpu_count
    spans = [s for s in (clipped(b, window) for b in billed(lifetime)) if s is not None]
    held_s = sum((seconds(s) for s in spans), Decimal(0))
    whole = held(lifetime)
    inside = clipped(whole, window) if whole is not None else None
    life_s = seconds(inside) if inside is not None else Decimal(0)
    runs = [r for r in (overlap(call, s) for call in calls for s in spans) if r is not None]
    busy_s = sum((seconds(s) for s in union(runs)), Decimal(0))
    rows = for_kind(book, life.gpu_kind)
    return Serving(
        gpu_seconds=held_s * gpus, idle_gpu_seconds=(held_s - busy_s) * gpus,
        asleep_gpu_seconds=max(life_s - held_s, Decimal(0)) * gpus, busy_seconds=busy_s,
        call_seconds=sum((seconds(r) for r in runs), Decimal(0)),
        gpu_cost=sum((cost_between(rows, a, b, gpus) for a, b in spans), Decimal(0)),
        gpu_kinds=frozenset({life.gpu_kind or UNKNOWN_KIND}),
        quantizations=frozenset({life.quantization}))


def serving_by_group(lives: Iterable[tuple[str, ReplicaLife]],
                     calls: Mapping[str, Sequence[Span]], book: Sequence[CostRow],
                     window: Window) -> dict[str, Serving]:
    """Each group's lifetimes summed; `calls` by replica id."""
    groups: dict[str, Serving] = {}
    for key, life in lives:
        use = serving(life, calls.get(life.lifetime.replica_id, ()), book, window)
        groups[key] = groups.get(key, Serving()) + use
    return groups


def overlap(a: Span, b: Span) -> Optional[Span]:
    start, end = max(a[0], b[0]), min(a[1], b[1])
    return (start, end) if start < end else None


def union(spans: Iterable[Span]) -> list[Span]:
    """The spans merged where they overlap or touch."""
    merged: list[Span] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def seconds(span: tuple[datetime, datetime]) -> Decimal:
    return exact_seconds(span[1] - span[0])


def row_view(revenue: Revenue, use: Serving) -> dict[str, Any]:
    """A row (or the totals) as the API shows it: money and seconds as exact decimal
    strings, ratios to 6 places and margin % to 2 (None where the ratio has no base)."""
    margin = revenue.total - use.gpu_cost
    return {
        "requests": revenue.requests, "prompt_tokens": revenue.prompt_tokens,
        "cached_tokens": revenue.cached_tokens, "completion_tokens": revenue.completion_tokens,
        "tokens": revenue.tokens, "token_revenue": money(revenue.token_revenue),
        "gpu_revenue": money(revenue.gpu_revenue), "revenue": money(revenue.total),
        "gpu_cost": money(use.gpu_cost), "margin": money(margin),
        "margin_pct": ratio(margin * 100, revenue.total, PERCENT_QUANTUM),
        "gpu_seconds": _seconds(use.gpu_seconds),
        "idle_gpu_seconds": _seconds(use.idle_gpu_seconds),
        "idle_share": ratio(use.idle_gpu_seconds, use.gpu_seconds),
        "asleep_gpu_seconds": _seconds(use.asleep_gpu_seconds),
        "sleep_share": ratio(use.asleep_gpu_seconds, use.gpu_seconds + use.asleep_gpu_seconds),
        "cost_per_1k_tokens": ratio(use.gpu_cost * 1000, Decimal(revenue.tokens), MONEY_QUANTUM),
        "cache_hit_rate": ratio(Decimal(revenue.cached_tokens), Decimal(revenue.prompt_tokens)),
        "mean_batch_size": ratio(use.call_seconds, use.busy_seconds),
        "quantization": sorted(use.quantizations), "gpu_kinds": sorted(use.gpu_kinds)}


def ratio(part: Decimal, whole: Decimal, quantum: Decimal = RATIO_QUANTUM) -> Optional[str]:
    if not whole:
        return None
    with localcontext() as ctx:
        ctx.prec = 60
        return f"{(part / whole).quantize(quantum):f}"


def money(value: Decimal) -> str:
    return f"{Decimal(value).quantize(MONEY_QUANTUM):f}"


def _seconds(value: Decimal) -> str:
    return f"{value.quantize(SECONDS_QUANTUM):f}"
