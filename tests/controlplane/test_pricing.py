"""Pricing is exact Decimal arithmetic per million tokens; the price book's timeline picks
the most specific price in effect at each instant."""
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from controlplane.billing.pricing import (PriceRow, PriceScope, Pricing, exact_seconds, gpu_cost,
                                  gpu_cost_between, invocation_cost, parse_price, price_at,
                                  segments, token_cost)

PRICES = Pricing(input_per_mtok=Decimal("0.50"), cached_input_per_mtok=Decimal("0.05"),
                 output_per_mtok=Decimal("1.5"), gpu_second=Decimal("0.0004"))


def test_cached_tokens_are_billed_at_the_cached_price():
    # 1000 prompt tokens of which 400 cached, 200 completion tokens:
    # 600 * 0.5 + 400 * 0.05 + 200 * 1.5 = 300 + 20 + 300 = 620 micro-dollars
    assert token_cost(PRICES, 1000, 400, 200) == Decimal("0.000620000000000")


def test_cost_is_exact_and_additive():
    one = token_cost(PRICES, 7, 3, 11)
    assert one * 1000 == token_cost(PRICES, 7000, 3000, 11000)
    assert one.as_tuple().exponent == -15


def test_cached_count_is_clamped_to_the_prompt():
    assert token_cost(PRICES, 10, 50, 0) == token_cost(PRICES, 10, 10, 0)


def test_gpu_cost():
    assert gpu_cost(PRICES, 2.5) == Decimal("0.001")


@pytest.mark.parametrize("value", [-1, "-0.1", "abc", True, None, [1], "1e-12", "nan", 1e10])
def test_bad_prices_name_the_field(value):
    with pytest.raises(ValueError, match="^pricing.input_per_mtok: "):
        parse_price("pricing.input_per_mtok", value)


def test_good_prices_parse_exactly():
    assert parse_price("p", 0.1) == Decimal("0.1")
    assert parse_price("p", "2.000000001") == Decimal("2.000000001")
    assert parse_price("p", 0) == 0


def test_a_served_call_adds_the_per_call_price_an_error_does_not():
    pricing = Pricing(output_per_mtok=Decimal(1), per_call=Decimal("0.001"))
    assert invocation_cost(pricing, 0, 0, 1000, charge_call=True) == Decimal("0.002")
    assert invocation_cost(pricing, 0, 0, 1000, charge_call=False) == Decimal("0.001")


T0 = datetime(2026, 5, 1, tzinfo=timezone.utc)
DEFAULT = PriceRow(PriceScope.DEFAULT, T0 - timedelta(days=365), Pricing(gpu_second=Decimal(1)))
PLAN = PriceRow(PriceScope.TENANT, T0 + timedelta(hours=1), Pricing(gpu_second=Decimal(2)))
PLAN_LATER = PriceRow(PriceScope.TENANT, T0 + timedelta(hours=3), Pricing(gpu_second=Decimal(3)))
OVERRIDE = PriceRow(PriceScope.DEPLOYMENT, T0 + timedelta(hours=2),
                    Pricing(gpu_second=Decimal(5)))
BOOK = [PLAN_LATER, OVERRIDE, DEFAULT, PLAN]          # any order


@pytest.mark.parametrize("hours, expected", [
    (-1, DEFAULT),            # before any plan: the default
    (1, PLAN),                # a row applies from its effective_from on, inclusive
    (1.5, PLAN),
    (2, OVERRIDE),            # an override beats the plan...
    (4, OVERRIDE),            # ...even a plan that changed after it
])
def test_the_most_specific_row_in_effect_applies(hours, expected):
    assert price_at(BOOK, T0 + timedelta(hours=hours)) == expected


def test_nothing_applies_before_the_first_row():
    assert price_at(BOOK, DEFAULT.effective_from - timedelta(seconds=1)) is None
    assert price_at([PLAN], T0) is None


def test_a_span_is_cut_where_the_price_changes():
    pieces = segments([DEFAULT, PLAN, PLAN_LATER], T0, T0 + timedelta(hours=4))
    assert [(a - T0, b - T0, p.gpu_second) for a, b, p in pieces] == [
        (timedelta(0), timedelta(hours=1), 1), (timedelta(hours=1), timedelta(hours=3), 2),
        (timedelta(hours=3), timedelta(hours=4), 3)]
    assert segments(BOOK, T0, T0) == []


def test_gpu_seconds_are_priced_at_the_price_of_their_time():
    # 2 GPUs from 00:30 to 02:30: 30 min at 1, 60 min at 2 (plan), 30 min at 5 (override)
    seconds, cost = gpu_cost_between(BOOK, T0 + timedelta(minutes=30),
                                     T0 + timedelta(hours=2, minutes=30), gpu_count=2)
    assert seconds == 2 * 7200
    assert cost == 2 * (1800 * 1 + 3600 * 2 + 1800 * 5)


def test_seconds_are_exact_to_the_microsecond():
    assert exact_seconds(timedelta(seconds=1, microseconds=1)) == Decimal("1.000001")
