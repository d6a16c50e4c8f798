"""controlplane/billing/margin.py without a database: one lifetime's held, idle and
asleep GPU-seconds, its calls' busy time and concurrency, its cost, and the ratios a row
shows (from sums, None where there is no base)."""
from datetime import datetime, timedelta, timezone
from decimal import Decimal

from controlplane.billing.costs import CostRow
from controlplane.billing.lifetimes import Lifetime, Window
from controlplane.billing.margin import (ReplicaLife, Revenue, Serving, quantization_of,
                                         row_view, serving, serving_by_group, union)

T0 = datetime(2027, 1, 1, tzinfo=timezone.utc)
BOOK = [CostRow(None, T0 - timedelta(days=1), Decimal("0.5")),
        CostRow("cuda", T0 - timedelta(days=1), Decimal("1"))]


def m(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def life(kind="cuda", gpus=2, placed=0.0, stopped=60.0, sleeps=()) -> ReplicaLife:
    return ReplicaLife(Lifetime("d", gpus, m(placed), m(stopped), None,
                                sleeps=tuple(m(s) for s in sleeps), replica_id="r"), kind, "int8")


def test_spans_that_overlap_or_touch_are_merged():
    assert union([(m(5), m(6)), (m(0), m(2)), (m(1), m(3)), (m(3), m(4))]) == [
        (m(0), m(4)), (m(5), m(6))]


def test_a_sleepers_held_idle_and_asleep_time_and_its_calls():
    """Held 0-20 and 40-60 min on 2 GPUs; calls 1-3 and 2-4 (3 min busy, 4 of calls) and
    one from 19 to 41 min, which ran only while held: 1 + 1 min."""
    calls = [(m(1), m(3)), (m(2), m(4)), (m(19), m(41))]
    use = serving(life(sleeps=(20, 40)), calls, BOOK, Window(m(0), m(60)))
    assert use.gpu_seconds == 2 * 2400 and use.asleep_gpu_seconds == 2 * 1200
    assert (use.busy_seconds, use.call_seconds) == (300, 360)
    assert use.idle_gpu_seconds == 2 * (2400 - 300)
    assert use.gpu_cost == 2 * 2400 * Decimal(1)
    assert (use.gpu_kinds, use.quantizations) == ({"cuda"}, {"int8"})


def test_the_window_clips_every_span_and_an_unknown_kind_costs_the_default():
    use = serving(life(kind=None, gpus=1, placed=-30, stopped=30), [(m(-10), m(10))], BOOK,
                  Window(m(0), m(60)))
    assert (use.gpu_seconds, use.busy_seconds, use.idle_gpu_seconds) == (1800, 600, 1200)
    assert use.gpu_cost == 1800 * Decimal("0.5") and use.gpu_kinds == {"unknown"}


def test_groups_sum_their_lifetimes():
    window = Window(m(0), m(60))
    groups = serving_by_group([("a", life()), ("a", life(kind="cpu", gpus=1)), ("b", life())],
                              {}, BOOK, window)
    assert groups["a"].gpu_seconds == 3 * 3600 and groups["a"].gpu_kinds == {"cuda", "cpu"}
    assert groups["a"].gpu_cost == 2 * 3600 + 3600 * Decimal("0.5")
    assert groups["b"] == serving(life(), [], BOOK, window)


def test_a_row_takes_its_ratios_from_its_sums_and_none_without_a_base():
    view = row_view(Revenue(2, 300, 100, 100, Decimal("1"), Decimal("3")),
                    Serving(Decimal(100), Decimal(25), Decimal(300), Decimal(10), Decimal(15),
                            Decimal("5"), frozenset({"cuda"}), frozenset({"none"})))
    assert (view["revenue"], view["margin"], view["margin_pct"]) == (
        "4.000000000000000", "-1.000000000000000", "-25.00")
    assert (view["idle_share"], view["sleep_share"], view["cache_hit_rate"],
            view["mean_batch_size"], view["cost_per_1k_tokens"]) == (
        "0.250000", "0.750000", "0.333333", "1.500000", "12.500000000000000")
    empty = row_view(Revenue(), Serving())
    assert [empty[k] for k in ("margin_pct", "idle_share", "sleep_share", "cache_hit_rate",
                               "mean_batch_size", "cost_per_1k_tokens")] == [None] * 6


def test_quantization_is_the_engines_else_the_checkpoints_else_none():
    assert quantization_of({"quantization": "int8"}, {"format": "gguf"}) == "int8"
    assert quantization_of({}, {"format": "gguf", "kept": {}}) == "gguf"
    assert quantization_of({"dtype": "bfloat16"}, None) == "none"
