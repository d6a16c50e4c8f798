"""Pricing is exact Decimal arithmetic per million tokens."""
from decimal import Decimal

import pytest

from controlplane.pricing import Pricing, gpu_cost, parse_price, token_cost

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
