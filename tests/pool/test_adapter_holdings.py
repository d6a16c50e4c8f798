"""The pool's bookkeeping of the adapters a replica holds: pure, no replica."""
from pool.adapter_holdings import AdapterHoldings


def test_room_is_made_from_the_least_recently_used():
    held = AdapterHoldings()
    for name in ("a", "b", "c"):
        held.added(name, 10)
    held.use("a")
    held.done("a")                        # a used last: b is now the oldest
    assert held.to_evict("d", capacity=3) == ["b"]
    assert held.to_evict("d", capacity=2) == ["b", "c"]
    assert held.to_evict("a", capacity=3) == []          # already held: no room needed


def test_an_adapter_in_use_is_never_taken_back():
    held = AdapterHoldings()
    for name in ("a", "b"):
        held.added(name, 10)
    held.use("a")
    held.use("b")
    assert held.to_evict("c", capacity=2) == []          # over capacity meanwhile
    held.done("b")
    assert held.to_evict("c", capacity=2) == ["b"]
    held.done("a")
    assert held.to_evict("c", capacity=1) == ["a", "b"]


def test_dropped_is_no_longer_held():
    held = AdapterHoldings()
    held.added("a", 10)
    assert held.holds("a")
    held.dropped("a")
    assert not held.holds("a") and held.to_evict("b", capacity=1) == []
