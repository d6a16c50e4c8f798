"""The usage write path: idempotent batches, and a durable outbox while Postgres is away."""
import asyncio
import json

import pytest
import pytest_asyncio
from sqlalchemy import func, select, text

from controlplane.db import create_db_engine, migrate_async
from controlplane.embedded import EmbeddedPostgres
from controlplane.metering import UsageWriter
from controlplane.models import UsageEvent
from controlplane.outbox import Outbox
from tests.controlplane.support.usage import make_record
from tests.support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(loop_scope="session")
async def engine(db_url):
    engine = create_db_engine(db_url)
    async with engine.begin() as conn:
        await conn.execute(text("TRUNCATE usage_events"))
    yield engine
    await engine.dispose()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def own_pg(tmp_path_factory):
    """A Postgres of our own to stop and start: the session one stays up."""
    pg = EmbeddedPostgres(tmp_path_factory.mktemp("own-pg") / "data").start()
    try:
        await migrate_async(pg.url)
        yield pg
    finally:
        pg.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def own_engine(own_pg):
    engine = create_db_engine(own_pg.url)
    async with engine.begin() as conn:
        await conn.execute(text("TRUNCATE usage_events"))
    yield engine
    await engine.dispose()
    own_pg.start()


async def count_rows(engine) -> int:
    async with engine.connect() as conn:
        return await conn.scalar(select(func.count()).select_from(UsageEvent))


async def _has_rows(engine, count: int) -> bool:
    return await count_rows(engine) >= count


async def test_replayed_events_are_written_once(engine, tmp_path):
    writer = UsageWriter(engine, Outbox(tmp_path / "outbox.jsonl"), batch_size=50,
                         flush_interval_s=0.01)
    await writer.start()
    records = [make_record() for _ in range(120)]
    for record in records + records[:40]:       # 40 replayed events
        writer.submit(record)
    writer.submit(records[0])
    await writer.stop()
    assert await count_rows(engine) == 120
    assert writer.pending == 0 and writer.outbox.depth == 0
    async with engine.connect() as conn:
        stored = (await conn.execute(select(UsageEvent).where(
            UsageEvent.invocation_id == records[7].invocation_id))).one()
    assert stored.cost == records[7].cost and stored.request_id == records[7].request_id


async def test_a_full_batch_is_written_without_waiting(engine, tmp_path):
    writer = UsageWriter(engine, Outbox(tmp_path / "outbox.jsonl"), batch_size=10,
                         flush_interval_s=3600)
    await writer.start()
    try:
        for _ in range(10):
            writer.submit(make_record())
        # the flush interval is an hour: only the full-batch path can write within the bound
        await eventually(lambda: _has_rows(engine, 10), timeout_s=30,
                         what="a full batch written without waiting for the 1 h flush interval")
        assert await count_rows(engine) == 10 and writer.pending == 0
    finally:
        await writer.stop()


async def test_a_batch_that_fills_while_gathering_is_written_at_once(engine, tmp_path):
    writer = UsageWriter(engine, Outbox(tmp_path / "outbox.jsonl"), batch_size=10,
                         flush_interval_s=60)
    await writer.start()
    try:
        for _ in range(9):
            writer.submit(make_record())
        await asyncio.sleep(0.3)                 # the writer is now gathering this batch
        assert await count_rows(engine) == 0 and writer.pending == 9, \
            "a batch short of batch_size waits for the flush interval"
        writer.submit(make_record())             # the tenth fills the batch
        await eventually(lambda: _has_rows(engine, 10), timeout_s=10,
                         what="the batch written once it filled, not after the 60 s interval")
        assert await count_rows(engine) == 10 and writer.pending == 0
    finally:
        await asyncio.wait_for(writer.stop(), 10)   # stop() does not wait out the interval


async def test_outbox_survives_a_postgres_outage_and_a_restart(own_pg, own_engine, tmp_path):
    pg, engine = own_pg, own_engine
    outbox_path = tmp_path / "outbox.jsonl"
    writer = UsageWriter(engine, Outbox(outbox_path), batch_size=20,
                         flush_interval_s=0.01, retry_s=3600)
    await writer.start()
    before = [make_record() for _ in range(15)]
    for record in before:
        writer.submit(record)
    await writer.flush()
    assert await count_rows(engine) == 15

    pg.stop()
    during = [make_record() for _ in range(30)]
    for record in during:
        writer.submit(record)
    await writer.flush()
    assert writer.pending == 0, "events left memory only into the durable outbox"
    lines = outbox_path.read_text().splitlines()
    assert sorted(json.loads(line)["invocation_id"] for line in lines) == \
        sorted(r.invocation_id for r in during)
    assert not writer.healthy
    await writer.stop()            # the control plane stops while Postgres is down

    pg.start()
    restarted = UsageWriter(engine, Outbox(outbox_path), batch_size=20,
                            flush_interval_s=0.01)
    assert restarted.outbox.depth == 30
    await restarted.start()        # a restart replays the outbox
    restarted.submit(during[3])    # and a replayed event is not doubled
    await restarted.stop()
    assert await count_rows(engine) == 45
    assert restarted.outbox.depth == 0 and outbox_path.read_text() == ""


async def test_outbox_is_replayed_when_postgres_returns(own_pg, own_engine, tmp_path):
    pg, engine = own_pg, own_engine
    writer = UsageWriter(engine, Outbox(tmp_path / "outbox.jsonl"), batch_size=20,
                         flush_interval_s=0.01, retry_s=0.05)
    await writer.start()
    pg.stop()
    for _ in range(25):
        writer.submit(make_record())
    await eventually(lambda: writer.outbox.depth == 25, timeout_s=30,
                     what="25 events in the outbox while Postgres is down")
    pg.start()
    await eventually(lambda: writer.outbox.depth == 0, timeout_s=60,
                     what="the writer replaying its outbox on its own once Postgres is back")
    assert await count_rows(engine) == 25 and writer.healthy
    await writer.stop()


async def test_a_torn_last_line_is_skipped(tmp_path):
    outbox = Outbox(tmp_path / "o.jsonl")
    outbox.append([make_record(), make_record()])
    with open(outbox.path, "a") as f:
        f.write('{"invocation_id": "half')
    assert len(Outbox(outbox.path).read()) == 2
