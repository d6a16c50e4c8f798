"""Pricing as pure Decimal functions: prices per million tokens, exact to 1e-15.

The operator's price book is a list of `PriceRow`s, each in effect from its
`effective_from` on: the platform default, a tenant's plan, a deployment's
override and an adapter's price (a LoRA adapter on a base deployment). At any
instant the most specific row already in effect applies (an adapter's row over
its base's override over the caller's plan over the default; within one scope,
the latest). `price_at` answers for one instant (an invocation is priced when it
starts), `segments` cuts a span of time where the price changes (GPU-seconds).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation, localcontext
from typing import Optional, Sequence, Union

MONEY_QUANTUM = Decimal("1e-15")        # NUMERIC(30, 15)
PRICE_QUANTUM = Decimal("1e-9")         # NUMERIC(18, 9)
MAX_PRICE = Decimal("1e9")


@dataclass(frozen=True)
class Pricing:
    input_per_mtok: Decimal = Decimal(0)
    cached_input_per_mtok: Decimal = Decimal(0)
    output_per_mtok: Decimal = Decimal(0)
    gpu_second: Decimal = Decimal(0)
    per_call: Decimal = Decimal(0)


PRICE_FIELDS = tuple(Pricing.__dataclass_fields__)
# The price book's tiers (migration 0023): a call is priced from the interactive rows; a
# batch line from the batch rows, else from the interactive ones discounted
# (controlplane.batch.pricing).
INTERACTIVE, BATCH = "interactive", "batch"
TIERS = (INTERACTIVE, BATCH)


class PriceScope(enum.IntEnum):
    """How specific a price row is; the higher applies."""
    DEFAULT = 0
    TENANT = 1
    DEPLOYMENT = 2
    ADAPTER = 3


@dataclass(frozen=True)
class PriceRow:
    scope: PriceScope
    effective_from: datetime
    pricing: Pricing


def parse_price(field: str, value: object) -> Decimal:
    """A non-negative price with at most 9 decimals; ValueError naming the field."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{field}: must be a number")
    try:
        price = Decimal(str(value))
    except InvalidOperation:
        raise ValueError(f"{field}: must be a number") from None
    if not price.is_finite() or price < 0:
        raise ValueError(f"{field}: must be a non-negative number")
    if price >= MAX_PRICE or price != price.quantize(PRICE_QUANTUM):
        raise ValueError(f"{field}: at most 9 decimals and below 1e9")
    return price


def token_cost(pricing: Pricing, prompt_tokens: int, cached_tokens: int,
               completion_tokens: int) -> Decimal:
    """Uncached prompt tokens at the input price, cached ones at the cached price."""
    cached = min(max(cached_tokens, 0), max(prompt_tokens, 0))
    uncached = max(prompt_tokens, 0) - cached
    with localcontext() as ctx:
        ctx.prec = 50
        micro = (uncached * pricing.input_per_mtok + cached * pricing.cached_input_per_mtok
                 + max(completion_tokens, 0) * pricing.output_per_mtok)
        return (micro / Decimal(1_000_000)).quantize(MONEY_QUANTUM)


def invocation_cost(pricing: Pricing, prompt_tokens: int, cached_tokens: int,
                    completion_tokens: int, *, charge_call: bool) -> Decimal:
    """The tokens, plus the per-call price for a call that was served (not an error)."""
    tokens = token_cost(pricing, prompt_tokens, cached_tokens, completion_tokens)
    return tokens + (pricing.per_call if charge_call else Decimal(0)).quantize(MONEY_QUANTUM)


def gpu_cost(pricing: Pricing, gpu_seconds: Union[Decimal, float]) -> Decimal:
    """GPU-seconds at the per-second price."""
    seconds = gpu_seconds if isinstance(gpu_seconds, Decimal) else Decimal(repr(gpu_seconds))
    with localcontext() as ctx:
        ctx.prec = 50
        return (seconds * pricing.gpu_second).quantize(MONEY_QUANTUM)


def price_at(rows: Sequence[PriceRow], at: datetime) -> Optional[PriceRow]:
    """The row that applies at `at`: the most specific scope in effect, its latest row."""
    live = [row for row in rows if row.effective_from <= at]
    return max(live, key=lambda row: (row.scope, row.effective_from), default=None)


def segments(rows: Sequence[PriceRow], start: datetime,
             end: datetime) -> list[tuple[datetime, datetime, Pricing]]:
    """[start, end) cut where the applicable price changes, each piece with its price
    (a piece before any row is in effect is left out: nothing is charged for it)."""
    if end <= start:
        return []
    cuts = sorted({start, end, *(r.effective_from for r in rows if start < r.effective_from < end)})
    pieces = []
    for piece_start, piece_end in zip(cuts, cuts[1:]):
        row = price_at(rows, piece_start)
        if row is not None:
            pieces.append((piece_start, piece_end, row.pricing))
    return pieces


def gpu_cost_between(rows: Sequence[PriceRow], start: datetime, end: datetime,
                     gpu_count: int) -> tuple[Decimal, Decimal]:
    """(GPU-seconds, cost) of `gpu_count` GPUs held over [start, end), each second at the
    price in effect then."""
    seconds, cost = Decimal(0), Decimal(0)
    for piece_start, piece_end, pricing in segments(rows, start, end):
        held = exact_seconds(piece_end - piece_start) * gpu_count
        seconds += held
        cost += gpu_cost(pricing, held)
    return seconds, cost


def exact_seconds(span: timedelta) -> Decimal:
    return (Decimal(span.days * 86_400 + span.seconds)
            + Decimal(span.microseconds) / Decimal(1_000_000))
