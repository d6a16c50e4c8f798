"""Pricing as pure Decimal functions: prices per million tokens, exact to 1e-15."""
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation, localcontext
from typing import Union

MONEY_QUANTUM = Decimal("1e-15")        # NUMERIC(30, 15)
PRICE_QUANTUM = Decimal("1e-9")         # NUMERIC(18, 9)
MAX_PRICE = Decimal("1e9")


@dataclass(frozen=True)
class Pricing:
    input_per_mtok: Decimal = Decimal(0)
    cached_input_per_mtok: Decimal = Decimal(0)
    output_per_mtok: Decimal = Decimal(0)
    gpu_second: Decimal = Decimal(0)


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


def gpu_cost(pricing: Pricing, gpu_seconds: Union[Decimal, float]) -> Decimal:
    """GPU-seconds at the per-second price (the billing report prices each revision's
    replica lifetimes with this)."""
    seconds = gpu_seconds if isinstance(gpu_seconds, Decimal) else Decimal(repr(gpu_seconds))
    with localcontext() as ctx:
        ctx.prec = 50
        return (seconds * pricing.gpu_second).quantize(MONEY_QUANTUM)
