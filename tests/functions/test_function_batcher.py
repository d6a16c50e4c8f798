"""The batcher's decision, stepped by hand: no clock, no server."""
import pytest

from runtime.functions.batcher import Batcher


def test_a_full_batch_is_due_at_once_and_holds_at_most_max_batch_size():
    b: Batcher[str] = Batcher(max_batch_size=3, max_wait_s=10.0)
    for i, item in enumerate("abcd"):
        b.add(item, now=float(i) * 0.001)
    assert b.wait_s(0.004) == 0.0
    assert b.take(0.004) == ["a", "b", "c"]          # oldest first, capped
    assert b.take(0.004) == []                       # "d" waits for its deadline
    assert b.wait_s(0.004) == pytest.approx(10.003 - 0.004)


def test_a_partial_batch_goes_at_the_oldest_items_deadline_not_before():
    b: Batcher[int] = Batcher(max_batch_size=8, max_wait_s=0.010)
    b.add(1, now=100.000)
    b.add(2, now=100.006)
    assert b.take(100.009) == []
    assert b.wait_s(100.009) == pytest.approx(0.001)
    assert b.take(100.010) == [1, 2]                 # the newer one rides along
    assert b.wait_s(100.010) is None and len(b) == 0


def test_zero_wait_sends_whatever_is_there():
    b: Batcher[int] = Batcher(max_batch_size=4, max_wait_s=0.0)
    b.add(7, now=5.0)
    assert b.take(5.0) == [7]


def test_batch_size_one_is_dynamic_batching_off():
    b: Batcher[int] = Batcher(max_batch_size=1, max_wait_s=1.0)
    b.add(1, now=0.0)
    b.add(2, now=0.0)
    assert [b.take(0.0), b.take(0.0), b.take(0.0)] == [[1], [2], []]


def test_nothing_waiting_means_no_deadline():
    b: Batcher[int] = Batcher(max_batch_size=2, max_wait_s=1.0)
    assert b.wait_s(0.0) is None and b.take(123.0) == [] and not b.is_due(1e9)


@pytest.mark.parametrize("size, wait", [(0, 1.0), (1, -0.5)])
def test_nonsense_settings_are_refused(size, wait):
    with pytest.raises(ValueError):
        Batcher(size, wait)
