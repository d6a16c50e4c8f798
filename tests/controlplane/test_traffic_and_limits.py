"""Traffic splits stick by request id; rate limits (per key, per tenant, corrected by the
real usage) on a passed-in clock."""
from collections import Counter

import pytest

from controlplane.errors import api_error_for
from controlplane.gateway.ratelimit import RateReservation, Limited, RateLimits, RateLimiter, TokenBucket
from controlplane.store.errors import InvalidField
from controlplane.deploy.traffic import choose, parse_split, rollback_target


def test_choice_is_deterministic_per_request_id():
    """Sticky means: the same id lands on the same revision in another process (a restarted
    or second control plane, another hash seed), in any call order, whatever order the split
    dict lists its revisions in. Comparing a call with itself in one process would pass for a
    choice keyed on Python's salted hash() or on per-process state."""
    import json
    import os
    import subprocess
    import sys

    split = {"r1": 90, "r2": 10}
    ids = [f"req-{i}" for i in range(200)]
    here = [choose(split, rid) for rid in ids]
    assert set(here) == {"r1", "r2"}, "the choice depends on the id"
    assert [choose(split, rid) for rid in reversed(ids)] == here[::-1]
    assert [choose({"r2": 10, "r1": 90}, rid) for rid in ids] == here
    code = ("import json, sys; from controlplane.deploy.traffic import choose; "
            "print(json.dumps([choose({'r1': 90, 'r2': 10}, f'req-{i}') for i in range(200)]))")
    for hash_seed in ("1", "2"):
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               check=True, env={**os.environ, "PYTHONHASHSEED": hash_seed})
        assert json.loads(other.stdout) == here, f"PYTHONHASHSEED={hash_seed}"


def test_choice_follows_the_percentages():
    counts = Counter(choose({"r1": 90, "r2": 10}, f"req-{i}") for i in range(5000))
    assert 4300 < counts["r1"] < 4700 and 300 < counts["r2"] < 700


def test_a_single_revision_takes_everything():
    assert {choose({"r3": 100}, str(i)) for i in range(100)} == {"r3"}


@pytest.mark.parametrize("body, field", [
    ({"r1": 90, "r2": 20}, "traffic"),
    ({"r1": 90, "r9": 10}, "traffic.r9"),
    ({"r1": 100.0}, "traffic.r1"),
    ({"r1": -10, "r2": 110}, "traffic.r1"),
    ({}, "traffic"),
    ([100], "traffic"),
])
def test_bad_splits_are_422_naming_the_field(body, field):
    with pytest.raises(InvalidField) as caught:
        parse_split(body, ["r1", "r2"])
    refusal = api_error_for(caught.value)
    assert refusal.status == 422 and refusal.param == field


def test_zero_percent_entries_are_dropped():
    assert parse_split({"r1": 0, "r2": 100}, ["r1", "r2"]) == {"r2": 100}


def test_rollback_picks_the_revision_before_the_newest_live_one():
    assert rollback_target({"r3": 100}, ["r1", "r2", "r3"]) == "r2"
    assert rollback_target({"r2": 90, "r3": 10}, ["r1", "r2", "r3"]) == "r2"
    with pytest.raises(InvalidField):
        rollback_target({"r1": 100}, ["r1", "r2"])


def test_bucket_refills_linearly_up_to_capacity():
    bucket = TokenBucket.per_minute(60, now=0.0)
    for _ in range(60):
        assert bucket.wait_for(1, now=0.0) == 0
        bucket.take(1, now=0.0)
    assert bucket.wait_for(1, now=0.0) == pytest.approx(1.0)
    assert bucket.wait_for(1, now=1.0) == 0
    assert bucket.wait_for(60, now=1000.0) == 0 and bucket.level == 60


def test_limiter_checks_both_buckets_and_takes_from_neither_when_refused():
    limiter = RateLimiter()
    limits = {"key:k": ("key", RateLimits(requests_per_min=2, tokens_per_min=100))}

    def admit(tokens, now):
        return limiter.admit(limits, tokens=tokens, now=now)
    assert isinstance(admit(60, 0.0), RateReservation)
    refused = admit(60, 0.0)
    assert refused.limit == "tokens_per_min" and refused.retry_after_s == pytest.approx(12.0)
    assert isinstance(admit(40, 0.0), RateReservation)             # the refusal took nothing
    refused = admit(1, 0.0)
    assert refused.limit == "requests_per_min" and refused.retry_after_s == pytest.approx(30.0)
    assert isinstance(admit(1, 30.0), RateReservation)

KEY = {"key:k": ("key", RateLimits(requests_per_min=100, tokens_per_min=100))}


def test_the_estimate_is_corrected_down_by_what_the_request_used():
    limiter = RateLimiter()
    first = limiter.admit(KEY, tokens=80, now=0.0)
    assert isinstance(limiter.admit(KEY, tokens=80, now=0.0), Limited), "80 + 80 > 100"
    limiter.settle(first, 10, now=0.0)                      # it used 10 of its 80
    assert isinstance(limiter.admit(KEY, tokens=80, now=0.0), RateReservation)


def test_the_estimate_is_corrected_up_and_the_bucket_may_go_below_zero():
    limiter = RateLimiter()
    first = limiter.admit(KEY, tokens=20, now=0.0)
    assert isinstance(limiter.admit(KEY, tokens=50, now=0.0), RateReservation)      # 30 left
    limiter.settle(first, 150, now=0.0)     # used more than estimated: charged up to a full bucket
    refused = limiter.admit(KEY, tokens=1, now=0.0)                           # 30 + 20 - 100
    assert refused == Limited("tokens_per_min", "key", pytest.approx(51 * 0.6))
    assert isinstance(limiter.admit(KEY, tokens=1, now=30.6), RateReservation)


def test_a_refused_request_settles_with_nothing_used():
    limiter = RateLimiter()
    admitted = limiter.admit(KEY, tokens=100, now=0.0)
    limiter.settle(admitted, 0, now=0.0)
    assert isinstance(limiter.admit(KEY, tokens=100, now=0.0), RateReservation)


def test_a_tenant_limit_is_shared_by_its_keys_and_each_key_keeps_its_own():
    limiter = RateLimiter()
    tenant = ("tenant", RateLimits(requests_per_min=3))

    def admit(key: str, now: float = 0.0):
        return limiter.admit({f"key:{key}": ("key", RateLimits(requests_per_min=2)),
                              "tenant:t": tenant}, tokens=1, now=now)

    assert all(isinstance(admit(k), RateReservation) for k in ("a", "a", "b"))
    assert admit("c") == Limited("requests_per_min", "tenant", pytest.approx(20.0))
    assert admit("a", now=20.0) == Limited("requests_per_min", "key", pytest.approx(10.0))
    assert isinstance(admit("b", now=20.0), RateReservation), "b's own bucket and the tenant's refilled"


def test_no_limit_means_no_bucket():
    limiter = RateLimiter()
    unlimited = {"tenant:t": ("tenant", RateLimits())}
    assert all(isinstance(limiter.admit(unlimited, tokens=10**9, now=0.0), RateReservation)
               for _ in range(1000))
