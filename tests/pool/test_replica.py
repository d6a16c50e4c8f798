"""The replica lifecycle state machine and its timestamps."""
from datetime import datetime, timedelta, timezone

import pytest

from pool.replica import InvalidTransition, Replica, ReplicaState as S

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def at(s):
    return s, T0 + timedelta(seconds=s)


def test_happy_path_records_every_stage():
    r = Replica("r1", "rev", *at(0))
    for t, state in [(1, S.PULLING), (4, S.LOADING), (6, S.READY), (60, S.DRAINING), (61, S.STOPPED)]:
        r.move(state, *at(t))
    assert [h.state for h in r.history] == [S.PENDING, S.PULLING, S.LOADING, S.READY, S.DRAINING, S.STOPPED]
    assert r.seconds_in(S.PENDING) == 1 and r.seconds_in(S.PULLING) == 3 and r.seconds_in(S.LOADING) == 2
    assert r.entered(S.READY) == 6 and r.since == T0 + timedelta(seconds=61)
    assert r.seconds_in(S.STOPPED) == 0.0


@pytest.mark.parametrize("path,bad", [
    ([], S.READY),
    ([S.PULLING], S.READY),
    ([S.PULLING, S.LOADING, S.READY], S.PULLING),
    ([S.PULLING, S.LOADING, S.READY], S.STOPPED),     # ready must drain first
    ([S.FAILED], S.PULLING),
    ([S.STOPPED], S.FAILED),
])
def test_illegal_transitions_raise(path, bad):
    r = Replica("r1", "rev", *at(0))
    for i, state in enumerate(path):
        r.move(state, *at(i + 1))
    with pytest.raises(InvalidTransition):
        r.move(bad, *at(99))


def test_failure_keeps_reason_and_starting_replica_may_stop():
    r = Replica("r1", "rev", *at(0))
    r.move(S.PULLING, *at(1))
    r.move(S.FAILED, *at(2), reason="NoSuchKey: model.safetensors")
    assert r.reason == "NoSuchKey: model.safetensors" and r.state is S.FAILED
    r2 = Replica("r2", "rev", *at(0))
    r2.move(S.PULLING, *at(1))
    r2.move(S.STOPPED, *at(2))
    assert r2.state is S.STOPPED
