"""GPU-second billing through crashes, against a real Postgres: the sink
(PostgresReplicaEvents) records what the pool reports, the report bills it.

A lifetime is billed from placement (the first event with slot ids) to its recorded
stop, or to the last heartbeat that saw it; never to now()."""
import uuid
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.db import create_db_engine, sessionmaker
from controlplane.store.tables import ReplicaLifetime
from controlplane.billing.pricing import Pricing
from controlplane.store import billing, prices
from controlplane.billing.outbox import DeadLetters
from controlplane.billing.refusals import DeadLetteringSink
from controlplane.store.desired_state import PostgresReplicaEvents
from pool.api import Heartbeat, ReplicaEvent, RevisionSpec
from pool.clock import Clock
from pool.registry import ManagedReplica
from pool.replica import Replica, ReplicaState
from pool.replica_events import ReplicaEvents
from tests.support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")
T0 = datetime(2026, 4, 1, 12, 0, tzinfo=timezone.utc)
SLOTS = ("gpu0", "gpu1")
FOREVER = billing.Window(datetime(2026, 1, 1, tzinfo=timezone.utc),
                         datetime(2100, 1, 1, tzinfo=timezone.utc))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def sessions(db_url):
    db_engine = create_db_engine(db_url)
    sessions = sessionmaker(db_engine)
    async with sessions.begin() as session:
        await prices.seed_default(session, Pricing(gpu_second=Decimal("0.001")))
    yield sessions
    await db_engine.dispose()


@pytest.fixture
def sink(sessions):
    return PostgresReplicaEvents(sessions)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


class Tenant:
    """One tenant's replicas (each test has its own tenant, so its report is its own)."""

    def __init__(self, sink):
        self.sink, self.id = sink, str(uuid.uuid4())
        self.ids = dict(revision_id=str(uuid.uuid4()), deployment_id=str(uuid.uuid4()),
                        tenant_id=self.id, gpu_count=2)

    async def event(self, replica_id: str, state: str, minutes: float, placed: bool = True):
        await self.sink.replica_changed(ReplicaEvent(
            replica_id=f"{self.id}-{replica_id}", state=state, at=at(minutes),
            slot_ids=SLOTS if placed else (), **self.ids))

    async def beat(self, minutes: float, *replica_ids: str):
        await self.sink.heartbeat(Heartbeat(at(minutes),
                                            tuple(f"{self.id}-{r}" for r in replica_ids)))

    async def gpu_seconds(self, sessions, window=FOREVER) -> Decimal:
        async with sessions() as session:
            report = await billing.report(session, self.id, window, "deployment")
        assert Decimal(report["totals"]["gpu_cost"]) == \
            Decimal(report["totals"]["gpu_seconds"]) * Decimal("0.001")
        return Decimal(report["totals"]["gpu_seconds"])

    async def row(self, sessions, replica_id: str) -> ReplicaLifetime:
        async with sessions() as session:
            return await session.scalar(select(ReplicaLifetime).where(
                ReplicaLifetime.replica_id == f"{self.id}-{replica_id}"))


async def test_a_replica_that_waited_20_minutes_for_capacity_bills_from_placement(sink, sessions):
    tenant = Tenant(sink)
    await tenant.event("r", "pending", 0, placed=False)
    await tenant.beat(15)                      # heartbeats while it waits: nothing to bill
    assert (await tenant.row(sessions, "r")).stopped_at is None, "a waiting replica stays open"
    await tenant.event("r", "pulling", 20)     # placed: it holds its 2 GPUs from here
    await tenant.event("r", "ready", 21)
    await tenant.event("r", "stopped", 30)
    assert await tenant.gpu_seconds(sessions) == 2 * 600
    row = await tenant.row(sessions, "r")
    assert (row.started_at, row.placed_at, row.stopped_at) == (at(0), at(20), at(30))


async def test_an_open_lifetime_after_a_crash_bills_to_its_last_heartbeat_not_to_now(
        sink, sessions):
    """The control plane died at 12:03 with the replica ready: no stop was ever recorded.
    However late the report runs, it bills up to the last heartbeat (12:02)."""
    tenant = Tenant(sink)
    await tenant.event("r", "pulling", 0)
    await tenant.event("r", "ready", 1)
    await tenant.beat(2, "r")
    assert await tenant.gpu_seconds(sessions) == 2 * 120
    row = await tenant.row(sessions, "r")
    assert row.stopped_at is None and row.last_seen_at == at(2)
    half = billing.Window(at(1), at(60))
    assert await tenant.gpu_seconds(sessions, half) == 2 * 60


async def test_a_heartbeat_that_omits_a_replica_closes_it_at_its_last_seen(sink, sessions):
    """After a restart the pool re-adopted `kept` and not `gone`: the first heartbeat
    continues one and closes the other where it was last seen, never later."""
    tenant = Tenant(sink)
    for replica in ("kept", "gone"):
        await tenant.event(replica, "pulling", 0)
        await tenant.event(replica, "ready", 1)
    await tenant.beat(5, "kept", "gone")
    await tenant.beat(40, "kept")              # the restarted pool's first heartbeat
    gone, kept = await tenant.row(sessions, "gone"), await tenant.row(sessions, "kept")
    assert (gone.state, gone.stopped_at) == ("lost", at(5)) and "heartbeat" in gone.reason
    assert (kept.stopped_at, kept.last_seen_at) == (None, at(40))
    assert await tenant.gpu_seconds(sessions) == 2 * (5 * 60 + 40 * 60)
    await tenant.event("gone", "ready", 41)    # a late event does not reopen it
    assert (await tenant.row(sessions, "gone")).stopped_at == at(5)


async def test_a_stop_recorded_after_the_heartbeat_closed_the_lifetime_wins(sink, sessions):
    """The pool retries events in order: a stop that could not be written when it happened
    arrives after a heartbeat already closed the lifetime at its last sighting."""
    tenant = Tenant(sink)
    await tenant.event("r", "pulling", 0)
    await tenant.beat(5, "r")
    await tenant.beat(10)                      # stopped at 7; the stop is still queued
    assert (await tenant.row(sessions, "r")).stopped_at == at(5)
    await tenant.event("r", "stopped", 7)
    row = await tenant.row(sessions, "r")
    assert (row.state, row.stopped_at) == ("stopped", at(7))
    assert await tenant.gpu_seconds(sessions) == 2 * 7 * 60


async def test_events_stamp_last_seen_and_a_stopped_lifetime_stays_stopped(sink, sessions):
    tenant = Tenant(sink)
    await tenant.event("r", "pulling", 0)
    await tenant.event("r", "ready", 3)
    assert (await tenant.row(sessions, "r")).last_seen_at == at(3)
    await tenant.event("r", "failed", 4)
    await tenant.event("r", "stopped", 9)
    await tenant.beat(10, "r")
    row = await tenant.row(sessions, "r")
    assert (row.state, row.stopped_at, row.last_seen_at) == ("failed", at(4), at(4))
    assert await tenant.gpu_seconds(sessions) == 2 * 240


async def test_the_replicas_own_counters_are_kept_for_reconciliation(sink, sessions):
    """Heartbeats carry what each replica says it served; its stop event the final count.
    A late, lower report (an earlier heartbeat retried) never moves them back."""
    tenant = Tenant(sink)
    await tenant.event("r", "pulling", 0)
    replica = f"{tenant.id}-r"
    await sink.heartbeat(Heartbeat(at(1), (replica,), {replica: (100, 40)}))
    row = await tenant.row(sessions, "r")
    assert (row.served_prompt_tokens, row.served_completion_tokens) == (100, 40)
    await sink.heartbeat(Heartbeat(at(2), (replica,), {replica: (90, 30)}))
    assert (await tenant.row(sessions, "r")).served_completion_tokens == 40
    await sink.replica_changed(ReplicaEvent(replica_id=replica, state="stopped", at=at(3),
                                            slot_ids=SLOTS, prompt_tokens=130,
                                            completion_tokens=55, **tenant.ids))
    row = await tenant.row(sessions, "r")
    assert (row.served_prompt_tokens, row.served_completion_tokens) == (130, 55)


async def test_a_sleeper_bills_nothing_asleep_is_not_lost_to_heartbeats_and_bills_again_awake(sink, sessions):
    """ready -> draining -> sleeping (no slots) -> waking (slots) -> ready -> stopped:
    billed from placement to the sleep and from the wake to the stop; a retried event is
    counted once."""
    tenant = Tenant(sink)
    await tenant.event("s", "pulling", 0)
    await tenant.event("s", "ready", 1)
    await tenant.event("s", "draining", 10)
    await tenant.event("s", "sleeping", 11, placed=False)
    await tenant.event("s", "sleeping", 11, placed=False)       # the pool retried it
    await tenant.beat(30)                                        # a sleeper is in no heartbeat
    row = await tenant.row(sessions, "s")
    assert (row.state, row.stopped_at, row.sleeps) == ("sleeping", None, [at(11)])
    assert await tenant.gpu_seconds(sessions) == 2 * 11 * 60
    await tenant.event("s", "waking", 40)
    await tenant.event("s", "ready", 41)
    await tenant.beat(45, "s")
    assert await tenant.gpu_seconds(sessions) == 2 * (11 + 5) * 60
    await tenant.event("s", "draining", 50)
    await tenant.event("s", "sleeping", 51, placed=False)
    await tenant.event("s", "stopped", 90, placed=False)
    row = await tenant.row(sessions, "s")
    assert row.sleeps == [at(11), at(40), at(51)] and row.stopped_at == at(90)
    assert row.ready_at == at(1), "its cold start's ready, not the wake's"
    assert await tenant.gpu_seconds(sessions) == 2 * (11 + 11) * 60


def queued_replica(tenant: "Tenant", name: str) -> ManagedReplica:
    """A replica of `tenant`'s, as the pool's event queue publishes it."""
    ids = tenant.ids
    spec = RevisionSpec(ids["revision_id"], ids["deployment_id"], ids["tenant_id"], "s3://b/m/",
                        gpu_count=ids["gpu_count"])
    managed = ManagedReplica(Replica(f"{tenant.id}-{name}", ids["revision_id"], 0.0, T0), spec)
    managed.replica.slot_ids = SLOTS
    return managed


async def test_a_refused_replica_event_is_dead_lettered_and_the_queue_goes_on(sessions, tmp_path):
    """A replica of one tenant reports, as it stops, a counter past BIGINT and a reason with
    a NUL byte; a heartbeat carries the counter too. Postgres refuses them for good: each
    is dead-lettered with Postgres's reason and recorded without the replica's words, and
    another tenant's events queued behind them land (the pool's queue used to offer the
    refused event forever, and every lifetime behind it waited)."""
    dead = DeadLetters(tmp_path / "replica-event-dead-letters.jsonl")
    sink = DeadLetteringSink(PostgresReplicaEvents(sessions), dead)
    events = ReplicaEvents(sink, Clock(), retry_cap_s=0.2)
    events.start()
    bad, good = Tenant(sink), Tenant(sink)
    poisoned, fine = queued_replica(bad, "r"), queued_replica(good, "r")
    for state in (ReplicaState.PULLING, ReplicaState.LOADING, ReplicaState.READY):
        events.move(poisoned, state)
    events.beat(Heartbeat(T0, (poisoned.replica_id,), {poisoned.replica_id: (2 ** 70, 1)}))
    poisoned.final_tokens = (2 ** 70, 5)
    events.move(poisoned, ReplicaState.DRAINING)
    events.move(poisoned, ReplicaState.STOPPED, reason="killed\x00")
    fine.final_tokens = (12, 34)
    for state in (ReplicaState.PULLING, ReplicaState.LOADING, ReplicaState.READY,
                  ReplicaState.DRAINING, ReplicaState.STOPPED):
        events.move(fine, state)

    async def good_row_closed():
        row = await good.row(sessions, "r")
        return row is not None and row.stopped_at is not None
    await eventually(good_row_closed, timeout_s=10, what="the other tenant's lifetime closed")
    await events.close(5.0)
    assert events.pending == 0
    row = await good.row(sessions, "r")
    assert (row.served_prompt_tokens, row.served_completion_tokens) == (12, 34)
    refused = await bad.row(sessions, "r")
    assert refused.state == "stopped" and refused.stopped_at is not None, "its GPU time still ends"
    assert refused.served_prompt_tokens is None and "dead letters" in refused.reason
    letters = dead.read()
    assert [letter["kind"] for letter in letters] == ["heartbeat", "replica_event"]
    assert letters[0]["item"]["tokens"] == {poisoned.replica_id: [2 ** 70, 1]}
    assert letters[1]["item"]["prompt_tokens"] == 2 ** 70
    assert letters[1]["item"]["reason"] == "killed\x00"
    assert all("value out of int64 range" in letter["error"] for letter in letters)


async def test_the_lifetime_keeps_the_kind_its_events_named(sink, sessions):
    """An event with slots names their kind (pool.api.ReplicaEvent.gpu_kind); one without
    (a sleep) names none and leaves the recorded kind as it was."""
    tenant = Tenant(sink)
    common = dict(replica_id=f"{tenant.id}-k", **tenant.ids)
    await sink.replica_changed(ReplicaEvent(state="pending", at=at(0), **common))
    assert (await tenant.row(sessions, "k")).gpu_kind is None
    await sink.replica_changed(ReplicaEvent(state="pulling", at=at(1), slot_ids=SLOTS,
                                            gpu_kind="cuda", **common))
    await sink.replica_changed(ReplicaEvent(state="sleeping", at=at(5), **common))
    await sink.replica_changed(ReplicaEvent(state="stopped", at=at(9), **common))
    assert (await tenant.row(sessions, "k")).gpu_kind == "cuda"
