"""benchmarks/gateway.py's arithmetic: percentiles, the added latency and the target."""
from __future__ import annotations

import pytest

from benchmarks.gateway import interleave, report, summarize


def test_added_latency_against_the_target():
    direct = [0.002 + i * 1e-5 for i in range(101)]          # 2.00 .. 3.00 ms
    summary = summarize([d + 0.0005 for d in direct], direct)
    assert summary.direct["p50"] == pytest.approx(2.5)
    assert summary.added_p50 == pytest.approx(0.5) and summary.added_p99 == pytest.approx(0.5)
    assert summary.paired["p99"] == pytest.approx(0.5)
    assert summary.target_met
    assert not summarize([d + 0.004 for d in direct], direct).target_met
    text = report(summary, 101, 5)
    assert "added latency (per pair): p50 +0.50 ms, p99 +0.50 ms; gateway / direct at p50: 1.20x" in text
    assert text.endswith(": met")


def test_the_added_p99_is_the_p99_of_each_pairs_difference():
    """The two paths' p99s match, yet in one pair in ten the gateway's call is 8 ms
    slower than its peer's: only the per-pair difference shows it."""
    direct = [0.002] * 100
    gateway = [0.0025] * 100
    for i in range(0, 100, 10):          # every 10th pair: the direct call is the slow one
        direct[i] = 0.010
    for i in range(5, 100, 10):          # and in 10 others the gateway's call is
        gateway[i] = 0.010
    summary = summarize(gateway, direct)
    assert summary.gateway["p99"] - summary.direct["p99"] == pytest.approx(0.0)
    assert summary.added_p99 == pytest.approx(8.0)
    assert summary.added_p50 == pytest.approx(0.5)


def test_pairs_alternate_which_path_goes_first():
    order: list[str] = []
    interleave(lambda: order.append("g") or 0.0, lambda: order.append("d") or 0.0, 3)
    assert order == ["g", "d", "d", "g", "g", "d"]
