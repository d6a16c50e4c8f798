"""controlplane/billing/costs.py: the cost book's pure rules, without a database: a kind's
row over the default, the latest row in effect within one, GPU time costed second by
second and cut where the row that applies changes."""
from datetime import datetime, timedelta, timezone
from decimal import Decimal

from controlplane.billing.costs import CostRow, cost_at, cost_between, for_kind

T0 = datetime(2027, 1, 1, tzinfo=timezone.utc)
DEFAULT = CostRow(None, T0, Decimal("0.001"))
CUDA = CostRow("cuda", T0 + timedelta(minutes=10), Decimal("0.01"))
CUDA_LATER = CostRow("cuda", T0 + timedelta(minutes=20), Decimal("0.02"))
CPU = CostRow("cpu", T0, Decimal("0.0001"))
BOOK = [DEFAULT, CUDA, CUDA_LATER, CPU]


def minutes(m: float) -> datetime:
    return T0 + timedelta(minutes=m)


def test_a_kinds_rows_are_its_own_and_the_default():
    assert for_kind(BOOK, "cuda") == [DEFAULT, CUDA, CUDA_LATER]
    assert for_kind(BOOK, None) == [DEFAULT], "an unknown kind: the default only"
    assert for_kind(BOOK, "cpu") == [DEFAULT, CPU]


def test_a_gpu_type_without_rows_of_its_own_is_priced_as_cuda():
    """A book written when every GPU was `cuda` keeps pricing GPUs the pool now names by type."""
    assert for_kind(BOOK, "h100") == [DEFAULT, CUDA, CUDA_LATER]
    assert cost_at(for_kind(BOOK, "h100"), minutes(25)) == CUDA_LATER
    assert cost_at(for_kind(BOOK, "h100"), minutes(5)) == DEFAULT, "before cuda's first row"


def test_a_gpu_types_own_row_wins_over_cuda_and_the_default():
    h100 = CostRow("h100", T0 + timedelta(minutes=15), Decimal("0.05"))
    l4 = CostRow("l4", T0, Decimal("0.003"))
    rows = for_kind([*BOOK, h100, l4], "h100")
    assert l4 not in rows and CPU not in rows
    assert cost_at(rows, minutes(12)) == CUDA, "before its own row: cuda's"
    assert cost_at(rows, minutes(25)) == h100, "its own, though cuda's is later"
    assert cost_at(for_kind([*BOOK, h100], "cuda"), minutes(25)) == CUDA_LATER, "a type's row prices only it"


def test_the_kinds_latest_row_in_effect_applies_else_the_defaults():
    cuda = for_kind(BOOK, "cuda")
    assert cost_at(cuda, minutes(5)) == DEFAULT, "before the kind's first row"
    assert cost_at(cuda, minutes(10)) == CUDA
    assert cost_at(cuda, minutes(25)) == CUDA_LATER
    assert cost_at(cuda, T0 - timedelta(seconds=1)) is None


def test_gpu_time_is_costed_second_by_second_where_the_row_changes():
    """Two GPUs from minute 5 to 25: 5 min at the default, 10 at 0.01, 5 at 0.02."""
    cost = cost_between(for_kind(BOOK, "cuda"), minutes(5), minutes(25), 2)
    assert cost == 2 * (300 * Decimal("0.001") + 600 * Decimal("0.01") + 300 * Decimal("0.02"))
    assert cost_between(for_kind(BOOK, "cpu"), minutes(0), minutes(1), 1) == Decimal("0.006")


def test_time_before_any_row_costs_nothing_and_an_empty_span_nothing():
    assert cost_between([CUDA], minutes(0), minutes(11), 1) == 60 * Decimal("0.01")
    assert cost_between(BOOK, minutes(3), minutes(3), 4) == 0
    assert cost_between([], minutes(0), minutes(60), 8) == 0
