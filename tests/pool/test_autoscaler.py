"""The autoscaling policy stepped through fake time: no clock, no server."""
from pool.autoscaler import PolicyState, ScalingConfig, ScalingSnapshot, policy

CFG = ScalingConfig(min_replicas=0, max_replicas=4, target_concurrency=4, idle_timeout_s=60,
                    scale_down_delay_s=10, target_queued_prompt_tokens=1000)


def step(state, **fields):
    fields.setdefault("config", CFG)
    decision, state = policy(ScalingSnapshot(**fields), state)
    return decision.desired, state


def test_cold_start_from_zero_on_first_queued_request():
    desired, _ = step(PolicyState(), now=0, queued_requests=1, queued_prompt_tokens=5)
    assert desired == 1


def test_scale_up_by_concurrency_and_by_prompt_tokens():
    assert step(PolicyState(), now=0, in_flight=(4, 4), queued_requests=3, ready=2, last_activity_at=0)[0] == 3
    assert step(PolicyState(), now=0, queued_requests=1, queued_prompt_tokens=3500)[0] == 4
    assert step(PolicyState(), now=0, in_flight=(40,), ready=1, last_activity_at=0)[0] == 4   # max bound


def test_scale_down_waits_for_delay_then_drops():
    s = PolicyState()
    d, s = step(s, now=100, in_flight=(1, 0, 0), ready=3, last_activity_at=100)
    assert d == 3                                 # lower count just appeared
    d, s = step(s, now=105, in_flight=(1, 0, 0), ready=3, last_activity_at=105)
    assert d == 3
    d, s = step(s, now=110, in_flight=(1, 0, 0), ready=3, last_activity_at=110)
    assert d == 1


def test_load_spike_resets_scale_down_delay():
    s = PolicyState()
    _, s = step(s, now=0, in_flight=(1, 0), ready=2, last_activity_at=0)
    _, s = step(s, now=5, in_flight=(4, 4), ready=2, last_activity_at=5)
    d, s = step(s, now=12, in_flight=(1, 0), ready=2, last_activity_at=12)
    assert d == 2 and s.lower_since == 12


def test_no_load_keeps_one_until_idle_timeout_then_zero():
    s = PolicyState()
    d, s = step(s, now=20, ready=1, last_activity_at=0)
    assert d == 1
    d, s = step(s, now=59.9, ready=1, last_activity_at=0)
    assert d == 1
    d, s = step(s, now=60, ready=1, last_activity_at=0)
    assert d == 0


def test_two_idle_replicas_go_one_after_delay_then_zero_at_idle():
    s = PolicyState()
    d, s = step(s, now=1, ready=2, last_activity_at=0)
    assert d == 2
    d, s = step(s, now=11, ready=2, last_activity_at=0)
    assert d == 1
    d, s = step(s, now=60, ready=1, last_activity_at=0)
    assert d == 0


def test_min_replicas_floor_even_when_idle():
    cfg = ScalingConfig(min_replicas=1, max_replicas=2, idle_timeout_s=1, scale_down_delay_s=0)
    assert step(PolicyState(), now=1000, config=cfg, ready=1, last_activity_at=0)[0] == 1
    assert step(PolicyState(), now=1000, config=cfg)[0] == 1


def test_starting_replica_with_waiters_is_never_scaled_down():
    # idle timer long expired, but a request waits for the replica that is starting
    d, _ = step(PolicyState(), now=10_000, queued_requests=1, starting=2, last_activity_at=0)
    assert d == 2


def test_starting_replica_without_waiters_is_still_not_idle_within_timeout():
    d, _ = step(PolicyState(), now=30, starting=1, last_activity_at=0)
    assert d == 1


def test_more_adapters_at_once_than_a_replicas_slots_scale_up():
    from dataclasses import replace
    cfg = replace(CFG, adapter_slots=4, target_concurrency=64)
    # 6 requests fit one replica's concurrency, but they hold 9 different adapters' leases
    assert step(PolicyState(), config=cfg, now=0, in_flight=(6,), ready=1, last_activity_at=0,
                adapters_in_use=9)[0] == 3
    assert step(PolicyState(), config=cfg, now=0, in_flight=(6,), ready=1, last_activity_at=0,
                adapters_in_use=4)[0] == 1
    assert step(PolicyState(), now=0, in_flight=(6,), ready=1, last_activity_at=0,
                adapters_in_use=9)[0] == 2, "without adapter slots the adapters count for nothing"
