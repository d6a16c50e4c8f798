"""Keep-alive windows learned from idle times, and the autoscaler following them: no clock."""
from pool.autoscaler import PolicyState, ScalingConfig, ScalingSnapshot, next_change_at, policy
from pool.keep_alive import IdleHistogram, IdleWindow, KeepAliveConfig, learn, next_edge, wants_replica

CFG = ScalingConfig(max_replicas=4, target_concurrency=4, idle_timeout_s=300, scale_down_delay_s=10,
                    sleep_timeout_s=0)


def histogram(*idle_s: float) -> IdleHistogram:
    hist = IdleHistogram(KeepAliveConfig())
    for value in idle_s:
        hist.add(value)
    return hist


def test_regular_calls_every_ten_minutes_learn_a_window_around_them():
    window = learn(histogram(*[600.0 + s for s in range(0, 40, 2)]))   # 600..638 s: one bin
    assert window == IdleWindow(prewarm_s=600 * 0.9, until_s=660 * 1.1)


def test_too_few_idle_times_or_a_flat_histogram_learn_nothing():
    assert learn(histogram(*[600.0] * 9)) is None
    spread = histogram(*[60.0 * i + 1 for i in range(240)])        # one in every bin: flat
    assert learn(spread) is None


def test_mostly_out_of_range_learns_nothing():
    hist = histogram(*([600.0] * 10 + [5 * 3600.0] * 11))
    assert hist.out_of_range == 11 and learn(hist) is None
    assert learn(histogram(*([600.0] * 10 + [5 * 3600.0] * 9))) is not None


def test_busy_deployment_keeps_one_from_the_start_of_idleness():
    window = learn(histogram(*[5.0] * 30, 70.0))
    assert window is not None and window.prewarm_s == 0.0 and window.until_s == 120 * 1.1


def test_window_edges():
    window = IdleWindow(prewarm_s=100.0, until_s=200.0)
    assert [wants_replica(window, t) for t in (0, 99.9, 100, 199.9, 200)] == [False, False, True, True, False]
    assert [next_edge(window, t) for t in (0, 150, 250)] == [100.0, 200.0, None]


def step(now, **fields):
    fields.setdefault("config", CFG)
    snap = ScalingSnapshot(now=now, **fields)
    decision, state = policy(snap, PolicyState())
    return decision, state, next_change_at(snap, state)


WINDOW = IdleWindow(prewarm_s=500.0, until_s=700.0)


def test_learned_window_drops_to_zero_at_once_then_prewarms_then_lets_go():
    d, _, at = step(100.0, ready=1, in_flight=(0,), last_activity_at=100.0, idle_window=WINDOW)
    assert d.desired == 0 and at == 600.0                     # no scale-down delay: it goes now
    d, _, at = step(600.0, last_activity_at=100.0, idle_window=WINDOW)
    assert d.desired == 1 and d.reason == "within its learned keep-alive window" and at == 800.0
    d, _, at = step(800.0, ready=1, in_flight=(0,), last_activity_at=100.0, idle_window=WINDOW)
    assert d.desired == 0 and at is None


def test_learned_window_sleeps_and_expires_sleepers_after_it():
    cfg = ScalingConfig(max_replicas=4, idle_timeout_s=300, sleep_timeout_s=3600)
    d, _, _ = step(100.0, config=cfg, ready=1, in_flight=(0,), last_activity_at=100.0, idle_window=WINDOW)
    assert d.sleep and d.expired == ()
    d, _, _ = step(900.0, config=cfg, asleep=(("r1", 110.0),), last_activity_at=100.0, idle_window=WINDOW)
    assert d.expired == ("r1",)


def test_past_the_window_a_replica_stops_rather_than_sleeps():
    cfg = ScalingConfig(max_replicas=4, idle_timeout_s=300, sleep_timeout_s=3600)
    d, _, _ = step(800.0, config=cfg, ready=1, in_flight=(0,), last_activity_at=100.0, idle_window=WINDOW)
    assert d.desired == 0 and not d.sleep
    d, _, _ = step(800.0, config=cfg, ready=1, in_flight=(0,), last_activity_at=100.0)   # fixed: it sleeps
    assert d.desired == 0 and d.sleep


def test_load_overrides_the_window():
    d, _, at = step(200.0, ready=1, in_flight=(3,), last_activity_at=200.0, idle_window=WINDOW)
    assert d.desired == 1 and at is None


def test_fixed_idle_timeout_comes_back_at_the_timeout():
    _, _, at = step(100.0, ready=1, in_flight=(0,), last_activity_at=100.0)
    assert at == 400.0
    _, _, at = step(100.0, last_activity_at=100.0)              # nothing up: nothing to time
    assert at is None
