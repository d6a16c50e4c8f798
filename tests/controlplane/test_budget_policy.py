"""Budget decisions (controlplane.budgets.policy) and the budget body (controlplane.budgets.spec),
with no server and no clock."""
from datetime import datetime, timezone
from decimal import Decimal

import pytest

from controlplane.billing.pricing import Pricing
from controlplane.budgets.policy import (Standing, Threshold, crossings, limit_reached, refusal,
                                         retry_after_s, soft_threshold, worst_case)
from controlplane.budgets.spec import parse_budget
from controlplane.errors import api_error_for
from controlplane.store.errors import InvalidField

START, END, NOW = (datetime(2026, 12, 1, tzinfo=timezone.utc), datetime(2027, 1, 1, tzinfo=timezone.utc),
                   datetime(2026, 12, 31, 23, 0, tzinfo=timezone.utc))


def standing(scope="tenant", limit="10", spent="0", reserved="0", period="month", end=END) -> Standing:
    return Standing(f"b-{scope}", scope, f"{scope}-id", Decimal(limit), Decimal(spent), Decimal(reserved),
                    period, START, end)


def test_worst_case_is_the_prompt_uncached_every_allowed_token_and_the_call():
    pricing = Pricing(Decimal(2), Decimal(1), Decimal(4), Decimal(0), Decimal("0.001"))
    assert worst_case(pricing, 1000, 500) == Decimal("0.002") + Decimal("0.002") + Decimal("0.001")


def test_room_counts_spend_reservations_and_this_call():
    assert refusal([standing(spent="4", reserved="5")], Decimal("1")) is None       # exactly the limit
    refused = refusal([standing(spent="4", reserved="5")], Decimal("1.000000001"))
    assert refused is not None and refused.budget_id == "b-tenant"


def test_a_budget_spent_to_its_limit_refuses_even_a_free_call():
    assert refusal([standing(spent="10")], Decimal(0)) is not None
    assert refusal([standing(spent="9.99")], Decimal(0)) is None


def test_the_broadest_budget_that_refuses_is_named():
    standings = [standing("deployment", limit="1", spent="1"), standing("key", limit="1", spent="1"),
                 standing("tenant", limit="100")]
    assert refusal(standings, Decimal("0.5")).scope == "key"
    standings.append(standing("tenant", limit="0"))
    assert refusal(standings, Decimal("0.5")).scope == "tenant"


def test_retry_after_is_soon_when_calls_in_flight_hold_the_room_else_the_period_end():
    held = standing(spent="2", reserved="8")
    assert not limit_reached(held, Decimal(1)) and limit_reached(held, Decimal(9))
    assert retry_after_s(held, Decimal(1), NOW) == 1.0
    spent = standing(spent="9.5")
    assert retry_after_s(spent, Decimal(1), NOW) == 3600.0
    assert retry_after_s(standing(spent="10", period="none", end=None), Decimal(1), NOW) is None


def test_soft_threshold_is_an_amount_or_a_share_of_the_limit():
    assert soft_threshold(Decimal(10), Decimal("0.8"), None) == Decimal(8)
    assert soft_threshold(Decimal(10), None, Decimal(3)) == Decimal(3)
    assert soft_threshold(Decimal(10), None, None) is None


def test_crossings():
    threshold = Threshold(Decimal(10), Decimal(8))
    assert crossings(threshold, Decimal("7.99")) == ()
    assert crossings(threshold, Decimal(8)) == ("soft",)
    assert crossings(threshold, Decimal(10)) == ("soft", "hard")
    assert crossings(Threshold(Decimal(10), None), Decimal(11)) == ("hard",)


def test_a_budget_body_parses_with_its_defaults():
    spec = parse_budget({"scope": "deployment", "deployment": "chat", "limit": "25.5", "soft_fraction": 0.8})
    assert (spec.scope, spec.target, spec.limit, spec.period, spec.time_zone) == (
        "deployment", "chat", Decimal("25.5"), "month", "UTC")
    assert spec.soft_fraction == Decimal("0.8") and spec.soft_amount is None
    assert parse_budget({"scope": "tenant", "tenant": "acme", "limit": 0}).target is None


@pytest.mark.parametrize("body, field", [
    ({"scope": "team", "limit": 1}, "scope"),
    ({"scope": "tenant"}, "limit"),
    ({"scope": "tenant", "limit": -1}, "limit"),
    ({"scope": "tenant", "limit": "lots"}, "limit"),
    ({"scope": "tenant", "limit": 1, "period": "week"}, "period"),
    ({"scope": "tenant", "limit": 1, "time_zone": "Mars/Olympus"}, "time_zone"),
    ({"scope": "key", "limit": 1}, "key"),
    ({"scope": "key", "key": "k", "deployment": "d", "limit": 1}, "deployment"),
    ({"scope": "tenant", "limit": 1, "soft_fraction": 1.5}, "soft_fraction"),
    ({"scope": "tenant", "limit": 1, "soft_fraction": 0}, "soft_fraction"),
    ({"scope": "tenant", "limit": 1, "soft_amount": 2}, "soft_amount"),
    ({"scope": "tenant", "limit": 1, "soft_amount": 1, "soft_fraction": 0.5}, "soft_amount"),
    ({"scope": "tenant", "limit": 1, "colour": "red"}, "colour"),
])
def test_bad_bodies_are_422_naming_the_field(body, field):
    with pytest.raises(InvalidField) as caught:
        parse_budget(body)
    refusal_ = api_error_for(caught.value)
    assert refusal_.status == 422 and refusal_.param == field


def test_budgets_go_unchecked_only_while_postgres_is_away_not_when_the_pool_is_busy():
    from sqlalchemy import exc as sa_exc

    from controlplane.gateway.llm import unreachable

    assert unreachable(ConnectionRefusedError(111, "refused"))
    assert unreachable(sa_exc.OperationalError("SELECT 1", {}, OSError("gone")))
    assert not unreachable(sa_exc.TimeoutError("QueuePool limit of size 10 overflow 10 reached"))
    assert not unreachable(ValueError("a bug"))
