"""Least outstanding requests with bounded-load prefix affinity."""
from pool.router import Candidate, RouterConfig, choose, rendezvous_order


def cands(**loads):
    return [Candidate(k, v) for k, v in loads.items()]


def test_least_outstanding_without_prefix():
    assert choose(cands(a=3, b=1, c=2)) == "b"
    assert choose(cands(a=1, b=1)) == "a"
    assert choose([]) is None


def test_same_prefix_same_replica_when_balanced():
    """The pick for a prefix is its rendezvous winner, whatever order the replicas are listed
    in (each request builds its list anew), while different prefixes spread over all of them."""
    pool = cands(a=0, b=0, c=0, d=0)
    keys = [f"prefix-{i}" for i in range(64)]
    picks = [choose(pool, key) for key in keys]
    assert picks == [rendezvous_order(pool, key)[0].replica_id for key in keys]
    for reordered in (pool[::-1], pool[2:] + pool[:2]):
        assert [choose(reordered, key) for key in keys] == picks
    assert set(picks) == {"a", "b", "c", "d"}
    assert choose(pool) == "a", "without a prefix the tie goes to the first id, not by hash"


def test_affinity_yields_when_preferred_replica_is_overloaded():
    pool = cands(a=0, b=0, c=0)
    preferred = rendezvous_order(pool, "k")[0].replica_id
    second = rendezvous_order(pool, "k")[1].replica_id
    loads = {c.replica_id: 0 for c in pool}
    loads[preferred] = 2                                  # within slack of 2
    assert choose(cands(**loads), "k") == preferred
    loads[preferred] = 3                                  # beyond the bound
    assert choose(cands(**loads), "k") == second


def test_bound_grows_with_load_factor():
    cfg = RouterConfig(load_factor=1.5, slack=0)
    pool = cands(a=10, b=10)
    preferred = rendezvous_order(pool, "k")[0].replica_id
    other = "b" if preferred == "a" else "a"
    assert choose(cands(**{preferred: 15, other: 10}), "k", cfg) == preferred
    assert choose(cands(**{preferred: 16, other: 10}), "k", cfg) == other


def test_removing_a_replica_moves_only_its_keys():
    full = cands(a=0, b=0, c=0, d=0)
    fewer = [c for c in full if c.replica_id != "d"]
    kept = 0
    for i in range(50):
        before = choose(full, f"p{i}")
        if before != "d":
            assert choose(fewer, f"p{i}") == before
            kept += 1
    assert 0 < kept < 50, "some keys were on d and moved, the rest stayed"


def test_adapter_goes_to_a_replica_holding_it():
    cands = [Candidate("a", 0), Candidate("b", 1, holds_adapter=True), Candidate("c", 2, holds_adapter=True)]
    assert choose(cands, "some-prefix", adapter="ad-1") == "b"


def test_adapter_holder_yields_past_the_load_bound():
    # the holder carries more than least + slack: the adapter is loaded elsewhere
    cands = [Candidate("a", 0), Candidate("b", 0), Candidate("holder", 9, holds_adapter=True)]
    picked = choose(cands, adapter="ad-1")
    assert picked in ("a", "b")
    assert picked == choose(cands, "ad-1")       # by rendezvous on the adapter's name


def test_an_adapter_nobody_holds_settles_by_its_name():
    cands = [Candidate(f"r{i}", 0) for i in range(6)]
    picks = {choose(cands, f"prefix-{i}", adapter="ad-7") for i in range(20)}
    assert len(picks) == 1                         # not spread by the prompts' prefixes
