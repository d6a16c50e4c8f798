"""The sleep tier's pure decisions: the autoscaler's sleep and expiry over fake time, the
state machine's sleep path, the per-node host-memory budget, a wake on its own slots, and
the wake record. No clock, no server."""
from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest

from pool.api import TenantQuota
from pool.autoscaler import PolicyState, ScalingConfig, ScalingSnapshot, policy
from pool.capacity import Capacity
from pool.cold_start import cold_start_timings
from pool.inventory import Slot
from pool.placement import GB, NoCapacity, Placed, PlacementRequest, SlotState, place
from pool.replica import LIVE, InvalidTransition, Replica, ReplicaState as S
from pool.settings import PoolSettings
from pool.sleep_budget import Sleeper, make_room

SLEEPY = ScalingConfig(min_replicas=0, max_replicas=2, idle_timeout_s=60, scale_down_delay_s=10,
                       sleep_timeout_s=300)
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def decide(config=SLEEPY, **fields):
    return policy(ScalingSnapshot(config=config, **fields), PolicyState())[0]


def test_an_idle_replica_goes_to_sleep_with_a_sleep_tier_and_to_zero_without():
    busy = decide(now=30, ready=1, in_flight=(0,), last_activity_at=0)
    assert (busy.desired, busy.sleep) == (1, False), "not idle yet"
    idle = decide(now=60, ready=1, in_flight=(0,), last_activity_at=0)
    assert (idle.desired, idle.sleep) == (0, True)
    plain = decide(ScalingConfig(idle_timeout_s=60), now=60, ready=1, in_flight=(0,), last_activity_at=0)
    assert (plain.desired, plain.sleep) == (0, False), "sleep_timeout_s 0: today's scale to zero"


def test_a_request_for_a_sleeping_revision_wants_one_awake_and_stops_no_sleeper():
    woken = decide(now=100, queued_requests=1, asleep=(("r1", 70.0),), last_activity_at=100)
    assert (woken.desired, woken.sleep, woken.expired) == (1, False, ())


def test_sleepers_stop_once_they_have_slept_sleep_timeout_s():
    asleep = (("old", 0.0), ("new", 200.0))
    assert decide(now=299, asleep=asleep, last_activity_at=0).expired == ()
    assert decide(now=300, asleep=asleep, last_activity_at=0).expired == ("old",)
    assert decide(now=500, asleep=asleep, last_activity_at=0).expired == ("old", "new")
    no_tier = ScalingConfig(idle_timeout_s=60)      # the tier switched off: every sleeper stops
    assert decide(no_tier, now=250, asleep=asleep, last_activity_at=0).expired == ("old", "new")


def at(s):
    return s, T0 + timedelta(seconds=s)


def test_the_sleep_path_of_the_state_machine():
    r = Replica("r1", "rev", *at(0))
    for t, state in [(1, S.PULLING), (2, S.LOADING), (3, S.READY), (60, S.DRAINING), (61, S.SLEEPING),
                     (90, S.WAKING), (91, S.READY)]:
        r.move(state, *at(t))
    assert {S.SLEEPING, S.WAKING} <= LIVE
    waking, ready = r.woken()
    assert (waking.mono, ready.mono) == (90, 91)
    for bad in (S.DRAINING, S.READY, S.SLEEPING):   # a sleeper only wakes or stops
        asleep = Replica("r2", "rev", *at(0))
        for t, state in [(1, S.PULLING), (2, S.LOADING), (3, S.READY), (4, S.DRAINING), (5, S.SLEEPING)]:
            asleep.move(state, *at(t))
        with pytest.raises(InvalidTransition):
            asleep.move(bad, *at(6))
    asleep.move(S.STOPPED, *at(7))
    with pytest.raises(InvalidTransition):
        Replica("r3", "rev", *at(0)).move(S.SLEEPING, *at(1))


def test_the_wake_record_is_marked_as_a_wake_with_its_stages():
    r = Replica("r1", "rev", *at(0))
    for t, state in [(1, S.PULLING), (3, S.LOADING), (7, S.READY)]:
        r.move(state, *at(t))
    assert cold_start_timings(r, 7.5).kind == "cold_start"
    for t, state in [(60, S.DRAINING), (61, S.SLEEPING), (100, S.WAKING), (100.25, S.READY)]:
        r.move(state, *at(t))
    r.wake_stages = {"weights_s": 0.2, "kv_cache_s": 0.01, "total_s": 0.24}
    timings = cold_start_timings(r, 0.3)
    assert (timings.kind, timings.load_s, timings.total_s, timings.download_s) == ("wake", 0.25, 0.25, 0.0)
    assert timings.queue_s == 0.3 and timings.load_stages["weights_s"] == 0.2


def sleeper(rid, since, gb, node="n1"):
    return Sleeper(rid, node, gb * GB, since)


def test_a_new_sleeper_stops_the_oldest_sleepers_on_its_node_until_it_fits():
    sleepers = [sleeper("b", 20, 4), sleeper("a", 10, 4), sleeper("c", 30, 4), sleeper("x", 0, 8, node="n2")]
    assert make_room(sleepers, "n1", 4 * GB, 16 * GB) == ()
    assert make_room(sleepers, "n1", 5 * GB, 16 * GB) == ("a",)
    assert make_room(sleepers, "n1", 12 * GB, 16 * GB) == ("a", "b")
    assert make_room(sleepers, "n1", 16 * GB, 16 * GB) == ("a", "b", "c")
    assert make_room(sleepers, "n1", 17 * GB, 16 * GB) is None, "too large to sleep at all"
    assert make_room(sleepers, "n2", 8 * GB, 16 * GB) == (), "other nodes' sleepers do not count"


def test_a_wake_asks_for_its_own_slots_and_no_others():
    free = [SlotState("n1/s0", "n1", 8 * GB), SlotState("n1/s1", "n1", 8 * GB, 7 * GB)]
    assert place(PlacementRequest(2 * GB, 1, on_slots=("n1/s0",)), free) == Placed("n1", ("n1/s0",), 2 * GB)
    assert isinstance(place(PlacementRequest(2 * GB, 1, on_slots=("n1/s1",)), free), NoCapacity), \
        "its own slot is taken: it does not move to another"


def test_a_claim_takes_free_slots_at_once_within_the_quota_or_nothing():
    async def run():
        capacity = Capacity(PoolSettings(accelerator="cpu"))
        await capacity.update([Slot("n/cpu0", "n", "cpu", 4 * GB), Slot("n/cpu1", "n", "cpu", 4 * GB)])
        capacity.set_quotas({"t1": TenantQuota(max_gpus=1)})
        own = PlacementRequest(3 * GB, 1, on_slots=("n/cpu0",))
        assert capacity.claim("r1", "t1", own) == Placed("n", ("n/cpu0",), 3 * GB)
        assert capacity.claim("r2", "t2", own) is None, "the slot is full"
        other = PlacementRequest(3 * GB, 1, on_slots=("n/cpu1",))
        assert capacity.claim("r3", "t1", other) is None, "the tenant is at its GPU quota"
        await capacity.release("r1", ("n/cpu0",))
        assert capacity.claim("r3", "t1", other) == Placed("n", ("n/cpu1",), 3 * GB)
        assert capacity.gpus_held() == {"t1": 1}
    asyncio.run(run())
