"""What budgets decide, as plain functions over small dataclasses: no clock, no database.

- `worst_case`: what a call may cost at most, reserved at admission.
- `refusal`: the budget a call would overrun, if any: a budget refuses once its billed
  spend reached the limit, or when spend + what is reserved + this call's worst case
  would pass it.
- `crossings`: the thresholds a budget's spend has reached (soft, hard).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Optional, Sequence

from controlplane.billing.pricing import Pricing, invocation_cost

SCOPES = ("tenant", "key", "deployment")       # also the order a refusal names them in
KINDS = ("soft", "hard")


@dataclass(frozen=True)
class Standing:
    """One budget in its current period, as admission sees it under the period's lock."""
    budget_id: str
    scope: str
    scope_id: str
    limit: Decimal
    spent: Decimal
    reserved: Decimal
    period: str                     # day | month | none
    period_start: datetime
    period_end: Optional[datetime]

    @property
    def left(self) -> Decimal:
        return max(Decimal(0), self.limit - self.spent - self.reserved)


@dataclass(frozen=True)
class Threshold:
    """A budget's limit and soft threshold (an amount), for `crossings`."""
    limit: Decimal
    soft: Optional[Decimal]


def worst_case(pricing: Pricing, prompt_tokens: int, max_tokens: int) -> Decimal:
    """The prompt (its estimate) uncached, every completion token the request may write,
    and the per-call price."""
    return invocation_cost(pricing, prompt_tokens, 0, max_tokens, charge_call=True)


def refusal(standings: Sequence[Standing], amount: Decimal) -> Optional[Standing]:
    """The budget that refuses a call of worst case `amount` (the broadest scope first),
    or None when every budget has room."""
    for standing in sorted(standings, key=lambda s: SCOPES.index(s.scope)):
        if standing.spent >= standing.limit or standing.spent + standing.reserved + amount > standing.limit:
            return standing
    return None


def limit_reached(standing: Standing, amount: Decimal) -> bool:
    """Whether the limit itself leaves no room for `amount` (a hard alert), not only
    what calls in flight hold."""
    return standing.spent >= standing.limit or standing.spent + amount > standing.limit


def retry_after_s(standing: Standing, amount: Decimal, now: datetime) -> Optional[float]:
    """When to try again: soon when only calls in flight hold the money (they settle
    below their worst case or not at all), else when the period ends (None: never)."""
    if not limit_reached(standing, amount):
        return 1.0
    if standing.period_end is None:
        return None
    return max(1.0, (standing.period_end - now).total_seconds())


def soft_threshold(limit: Decimal, fraction: Optional[Decimal],
                   amount: Optional[Decimal]) -> Optional[Decimal]:
    """The soft threshold as an amount (a fraction is of the limit); None: no soft alert."""
    if amount is not None:
        return amount
    if fraction is not None:
        return limit * fraction
    return None


def crossings(threshold: Threshold, spent: Decimal) -> tuple[str, ...]:
    """The kinds of alert a budget with this spend has reached ('soft', 'hard')."""
    kinds = []
    if threshold.soft is not None and spent >= threshold.soft:
        kinds.append("soft")
    if spent >= threshold.limit:
        kinds.append("hard")
    return tuple(kinds)
