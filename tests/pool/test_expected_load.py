"""The expected load a new replica is placed by: a decayed average of requests in flight."""
import math

import pytest

from pool.expected_load import InFlightAverage, replica_load


def test_a_steady_count_is_its_own_average_and_a_past_burst_fades():
    avg = InFlightAverage(window_s=100.0)
    avg.update(0.0, 8)
    assert avg.average(0.0) == 0.0
    assert avg.average(100.0) == pytest.approx(8 * (1 - math.exp(-1)))
    assert avg.average(10_000.0) == pytest.approx(8.0)
    avg.update(10_000.0, 0)                       # the burst ends
    assert avg.average(10_100.0) == pytest.approx(8 * math.exp(-1))
    assert avg.average(20_000.0) == pytest.approx(0.0, abs=1e-9)


def test_an_update_from_the_past_does_not_move_time_back():
    avg = InFlightAverage(window_s=100.0)
    avg.update(50.0, 4)
    avg.update(40.0, 2)
    assert avg.at == 50.0 and avg.count == 2


def test_replica_load_is_the_share_of_what_replicas_are_sized_for():
    assert replica_load(16.0, 32, 1) == 0.5
    assert replica_load(16.0, 32, 2) == 0.25
    assert replica_load(100.0, 8, 1) == 1.0
    assert replica_load(3.0, 0, 0) == 1.0          # degenerate sizes never divide by zero


def test_a_revision_expects_its_next_replica_to_share_its_requests():
    from pool.activator import RevisionQueue
    from pool.registry import ManagedReplica, RevisionState
    from pool.replica import Replica, ReplicaState
    from tests.support.pool_calls import spec_for

    spec = spec_for("s3://b/m/", target_concurrency=8)
    rev = RevisionState(spec, RevisionQueue(spec.revision_id, 8))
    from datetime import datetime, timezone
    busy = ManagedReplica(Replica("r1", spec.revision_id, 0.0, datetime.now(timezone.utc)), spec, in_flight=6)
    for state in (ReplicaState.PULLING, ReplicaState.LOADING, ReplicaState.READY):
        busy.replica.move(state, 0.0, datetime.now(timezone.utc))
    rev.add(busy)
    rev.note_in_flight(0.0)
    assert rev.next_replica_load(0.0) == 0.0                 # no history yet
    assert rev.next_replica_load(10_000.0) == pytest.approx(6 / 8 / 2)   # shared by two replicas
