"""pool/replica_events.py: what reaches the billing sink, in what order, through its failures.

A sink that fails is offered the same item again after a backoff, so it takes every
event once, in the order the pool produced them; heartbeats queued behind a failing
sink collapse into the newest; a queue that reaches its bound drops the newest events
with an error line, never the older ones.
"""
from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta, timezone

from pool.api import Heartbeat, ReplicaEvent, RevisionSpec
from pool.clock import Clock
from pool.in_memory import EventLog
from pool.registry import ManagedReplica
from pool.replica import Replica, ReplicaState
from pool.replica_events import ReplicaEvents, retry_delay

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
SPEC = RevisionSpec("rev", "dep", "ten", "s3://b/m/", gpu_count=1)


class FlakySink(EventLog):
    """An EventLog that refuses the next `failures` calls (events and heartbeats alike)."""

    def __init__(self, failures: int = 0):
        super().__init__()
        self.failures = failures
        self.calls = 0

    def _maybe_fail(self) -> None:
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("database is down")

    async def replica_changed(self, event: ReplicaEvent) -> None:
        self._maybe_fail()
        await super().replica_changed(event)

    async def heartbeat(self, beat: Heartbeat) -> None:
        self._maybe_fail()
        await super().heartbeat(beat)


def managed(replica_id: str) -> ManagedReplica:
    return ManagedReplica(Replica(replica_id, "rev", 0.0, T0), SPEC)


def beat(seconds: int, *ids: str) -> Heartbeat:
    return Heartbeat(T0 + timedelta(seconds=seconds), ids)


def test_retry_delay_doubles_up_to_its_cap():
    assert [retry_delay(n, 1.0) for n in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert retry_delay(100_000, 10.0) == 10.0                # a sink down for days: no overflow


async def test_a_failing_sink_gets_every_event_once_in_order():
    sink = FlakySink(failures=3)
    events = ReplicaEvents(sink, Clock(), retry_cap_s=0.05)
    events.start()
    a, b = managed("a"), managed("b")
    events.publish(a)                                  # pending
    events.move(a, ReplicaState.PULLING)
    events.publish(b)
    events.move(a, ReplicaState.LOADING)
    assert await sink.wait_for(lambda got: len(got) == 4, 10)
    assert [(e.replica_id, e.state) for e in sink.events] == [
        ("a", "pending"), ("a", "pulling"), ("b", "pending"), ("a", "loading")]
    assert sink.calls == 3 + 4 and events.pending == 0
    await events.close(1.0)


async def test_heartbeats_behind_a_failing_sink_collapse_into_the_newest_after_the_events():
    sink = FlakySink(failures=1_000_000)               # down until the test lets it up
    events = ReplicaEvents(sink, Clock(), retry_cap_s=0.05)
    events.start()
    a = managed("a")
    events.beat(beat(0))
    events.publish(a)
    events.beat(beat(15, "a"))
    events.move(a, ReplicaState.PULLING)
    events.beat(beat(30, "a"))
    await asyncio.sleep(0.2)                           # a few failed tries of the head
    sink.failures = 0
    assert await sink.wait_for(lambda got: len(got) == 2 and sink.beats, 10)
    assert [e.state for e in sink.events] == ["pending", "pulling"]
    assert sink.beats == [beat(30, "a")], "only the newest heartbeat, sent after the events before it"
    await events.close(1.0)


async def test_a_full_queue_drops_the_newest_events_with_an_error_line(caplog):
    sink = FlakySink(failures=1_000_000)
    events = ReplicaEvents(sink, Clock(), limit=2, retry_cap_s=0.05)
    with caplog.at_level(logging.ERROR, logger="pool.replica_events"):
        for rid in ("a", "b", "c"):
            events.publish(managed(rid))
        events.beat(beat(0, "a"))                      # heartbeats do not count
    assert events.pending == 2 and events.dropped == 1
    assert "replica event queue is full (2 events the sink has not taken): dropped the pending event " \
        "of replica c" in caplog.text
    events.start()
    sink.failures = 0
    assert await sink.wait_for(lambda got: len(got) == 2 and sink.beats, 10)
    assert [e.replica_id for e in sink.events] == ["a", "b"]
    await events.close(1.0)


async def test_a_stopped_event_carries_the_tokens_read_as_the_replica_stopped():
    sink = FlakySink()
    events = ReplicaEvents(sink, Clock())
    events.start()
    m = managed("a")
    m.replica.slot_ids = ("n/cpu0",)
    m.final_tokens = (120, 48)
    for state in (ReplicaState.PULLING, ReplicaState.LOADING, ReplicaState.READY, ReplicaState.DRAINING,
                  ReplicaState.STOPPED):
        events.move(m, state)
    assert await sink.wait_for(lambda got: len(got) == 5, 10)
    counted = [(e.state, e.prompt_tokens, e.completion_tokens) for e in sink.events]
    assert counted[-1] == ("stopped", 120, 48)
    assert all(p is None and c is None for _, p, c in counted[:-1])
    assert all(e.slot_ids == ("n/cpu0",) for e in sink.events)
    await events.close(1.0)


async def test_close_gives_up_on_a_sink_that_never_takes_and_says_how_much_is_left(caplog):
    sink = FlakySink(failures=1_000_000)
    events = ReplicaEvents(sink, Clock(), retry_cap_s=0.05)
    events.start()
    events.publish(managed("a"))
    with caplog.at_level(logging.ERROR, logger="pool.replica_events"):
        await events.close(0.3)
    assert "did not take 1 event(s) before stop" in caplog.text


async def test_an_event_that_carries_slots_names_their_kind():
    """The kind comes from `kind_of` (the pool's Capacity.kind_of) for the slots the event
    carries; an event with no slots (pending, sleeping) names none."""
    sink = EventLog()
    asked: list[tuple[str, ...]] = []

    def kind_of(slot_ids):
        asked.append(tuple(slot_ids))
        return "cuda"

    events = ReplicaEvents(sink, Clock(), kind_of=kind_of)
    events.start()
    a = managed("a")
    events.publish(a)                                  # pending: no slots yet
    a.replica.slot_ids = ("n/cuda0",)
    for state in (ReplicaState.PULLING, ReplicaState.LOADING, ReplicaState.READY,
                  ReplicaState.DRAINING):
        events.move(a, state)
    a.replica.slot_ids = ()
    events.move(a, ReplicaState.SLEEPING)
    assert await sink.wait_for(lambda got: len(got) == 6, 10)
    assert [(e.state, e.gpu_kind) for e in sink.events] == [
        ("pending", None), ("pulling", "cuda"), ("loading", "cuda"), ("ready", "cuda"),
        ("draining", "cuda"), ("sleeping", None)]
    assert asked == [("n/cuda0",)] * 4
    await events.close(1.0)
