"""A budget as the API takes it (PUT /v1/budgets), checked field by field: pure.

    {"scope": "tenant" | "key" | "deployment",
     "tenant": "<name>",          admin only: whose budget (a tenant sets its own)
     "key": "<key id or prefix>", with scope key
     "deployment": "<name>",      with scope deployment
     "limit": "25.00",            money, as the price book writes it
     "period": "day" | "month" | "none",       default month
     "time_zone": "Europe/Berlin",             default UTC
     "soft_fraction": 0.8 | "soft_amount": "20"}   at most one; none: no soft alert
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Optional

from controlplane.billing.pricing import parse_price
from controlplane.budgets.periods import PERIODS, zone
from controlplane.budgets.policy import SCOPES
from controlplane.fields import obj, text
from controlplane.store.errors import InvalidField

FIELDS = {"scope", "tenant", "key", "deployment", "limit", "period", "time_zone", "soft_fraction",
          "soft_amount"}
FRACTION_QUANTUM = Decimal("1e-5")          # NUMERIC(6, 5)


@dataclass(frozen=True)
class BudgetSpec:
    scope: str
    tenant: Optional[str]           # the tenant's name, as the admin gave it
    target: Optional[str]           # the key's id or prefix, or the deployment's name
    limit: Decimal
    period: str = "month"
    time_zone: str = "UTC"
    soft_fraction: Optional[Decimal] = None
    soft_amount: Optional[Decimal] = None


def parse_budget(body: Any) -> BudgetSpec:
    body = obj("body", body, FIELDS)
    scope = body.get("scope")
    if scope not in SCOPES:
        raise InvalidField("scope", f"must be one of {', '.join(SCOPES)}")
    tenant = text("tenant", body["tenant"]) if body.get("tenant") is not None else None
    target = _target(scope, body)
    limit = _money("limit", body.get("limit"))
    period = body.get("period", "month")
    if period not in PERIODS:
        raise InvalidField("period", f"must be one of {', '.join(PERIODS)}")
    time_zone = text("time_zone", body.get("time_zone", "UTC"), max_length=64)
    try:
        zone(time_zone)
    except ValueError as exc:
        raise InvalidField("time_zone", str(exc)) from None
    fraction, amount = _soft(body, limit)
    return BudgetSpec(scope, tenant, target, limit, period, time_zone, fraction, amount)


def _target(scope: str, body: dict[str, Any]) -> Optional[str]:
    """The key or deployment a budget of that scope is on; no other scope's field."""
    for other in ("key", "deployment"):
        if other != scope and other in body:
            raise InvalidField(other, f"not for a {scope} budget")
    if scope == "tenant":
        return None
    if body.get(scope) is None:
        raise InvalidField(scope, f"required for a {scope} budget")
    return text(scope, body[scope])


def _money(field: str, value: Any) -> Decimal:
    if value is None:
        raise InvalidField(field, "required")
    try:
        return parse_price(field, value)
    except ValueError as exc:
        raise InvalidField(field, str(exc).split(": ", 1)[-1]) from None


def _soft(body: dict[str, Any], limit: Decimal) -> tuple[Optional[Decimal], Optional[Decimal]]:
    fraction, amount = body.get("soft_fraction"), body.get("soft_amount")
    if fraction is not None and amount is not None:
        raise InvalidField("soft_amount", "give soft_fraction or soft_amount, not both")
    if amount is not None:
        soft = _money("soft_amount", amount)
        if soft > limit:
            raise InvalidField("soft_amount", "must not exceed the limit")
        return None, soft
    if fraction is None:
        return None, None
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float, str)):
        raise InvalidField("soft_fraction", "must be a number")
    try:
        share = Decimal(str(fraction))
    except InvalidOperation:
        raise InvalidField("soft_fraction", "must be a number") from None
    if not share.is_finite() or not 0 < share <= 1 or share != share.quantize(FRACTION_QUANTUM):
        raise InvalidField("soft_fraction", "must be above 0 and at most 1, with at most 5 decimals")
    return share, None
