"""The usage write path: idempotent batches, a durable framed outbox while Postgres is away,
a bounded buffer, timeouts, and a dead-letter file for what Postgres refuses for good."""
import asyncio
import dataclasses
import logging
import signal
import sys
import time
import uuid
import zlib
from decimal import Decimal
from pathlib import Path

import pytest
import pytest_asyncio
from sqlalchemy import func, select, text

from controlplane.db import create_db_engine
from controlplane.billing.metering import UsageWriter
from controlplane.store.tables import UsageEvent
from controlplane.billing.outbox import Outbox, frame, unframe
from controlplane.settings import Settings
from controlplane.billing.usage import UsageRecord
from tests.controlplane.support.postgres import frozen
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
    assert sorted(r.invocation_id for r in Outbox(outbox_path).read()) == \
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


async def test_a_torn_tail_is_cut_before_the_next_append(tmp_path):
    """A crash mid-append leaves half a record: opening the outbox cuts it, so the next
    record is not glued to it; so does an append after a write that failed half way."""
    outbox = Outbox(tmp_path / "o.jsonl")
    first = [make_record(), make_record()]
    outbox.append(first)
    whole = outbox.path.read_bytes()
    torn = frame(make_record().to_json().encode())
    outbox.path.write_bytes(whole + torn[:len(torn) // 2])      # the crash
    reopened = Outbox(outbox.path)
    assert reopened.depth == 2 and outbox.path.read_bytes() == whole
    after = make_record()
    outbox.path.write_bytes(whole + torn[:7])                   # a write that died half way
    reopened.append([after])
    assert [r.invocation_id for r in Outbox(outbox.path).read()] == \
        [r.invocation_id for r in [*first, after]]


async def test_records_are_framed_with_length_and_checksum(tmp_path):
    outbox = Outbox(tmp_path / "o.jsonl")
    record = make_record()
    outbox.append([record])
    line = outbox.path.read_bytes()
    length, crc, payload = line.rstrip(b"\n").split(b" ", 2)
    assert int(length) == len(payload) and int(crc, 16) == zlib.crc32(payload)
    assert unframe(line.rstrip(b"\n")) == payload == record.to_json().encode()
    flipped = line.replace(b'"ok"', b'"ko"')
    assert unframe(flipped.rstrip(b"\n")) is None, "a changed byte fails the checksum"
    legacy = record.to_json().encode()                          # a line from before framing
    assert unframe(legacy) == legacy


async def test_a_corrupt_line_is_dead_lettered_and_replay_goes_on(engine, tmp_path):
    outbox = Outbox(tmp_path / "o.jsonl")
    good = [make_record() for _ in range(5)]
    outbox.append(good[:2])
    with open(outbox.path, "ab") as f:
        f.write(b"12 0000abcd a page of junk\n")                # a lost page, not a torn tail
    outbox.append(good[2:])
    writer = UsageWriter(engine, Outbox(outbox.path), batch_size=2, flush_interval_s=0.01)
    await writer.start()
    await writer.stop()
    assert await count_rows(engine) == 5 and writer.outbox.depth == 0
    (letter,) = writer.dead_letters.read()
    assert letter["line"] == "12 0000abcd a page of junk" and "checksum" in letter["error"]
    assert writer.metrics.usage_dead_letters._value.get() == 1


def poisoned(**changes) -> UsageRecord:
    """A record Postgres refuses for good (a data error, not an outage)."""
    return dataclasses.replace(make_record(), **changes)


@pytest.mark.parametrize("poison", [{"tenant_id": "not-a-uuid"},
                                    {"cost": Decimal("1e20")},           # NUMERIC(30, 15)
                                    {"request_id": "nul\x00byte"},
                                    {"prompt_tokens": 2 ** 70},          # past BIGINT
                                    {"http_status": 2 ** 40},            # past INTEGER
                                    {"cost": Decimal("NaN")},            # stored, were it let through
                                    {"cost": Decimal("Infinity")},
                                    {"total_s": float("nan")},
                                    {"gpu_seconds": float("inf"), "items": 1}])
async def test_a_record_postgres_refuses_goes_to_the_dead_letter_file(engine, tmp_path, caplog,
                                                                      poison):
    writer = UsageWriter(engine, Outbox(tmp_path / "o.jsonl"), batch_size=50,
                         flush_interval_s=0.01)
    await writer.start()
    good = [make_record() for _ in range(40)]
    bad = poisoned(**poison)
    for record in good[:17] + [bad] + good[17:]:
        writer.submit(record)
    with caplog.at_level(logging.ERROR, logger="thawpool.metering"):
        await writer.stop()
    assert await count_rows(engine) == 40, "the rest of the batch is written"
    assert writer.outbox.depth == 0 and writer.healthy
    (letter,) = writer.dead_letters.read()
    assert letter["record"]["invocation_id"] == bad.invocation_id and letter["error"]
    assert writer.metrics.usage_dead_letters._value.get() == 1
    assert any(getattr(r, "alert", None) == "usage_dead_letter" for r in caplog.records)


async def test_one_tenants_poisoned_events_hold_up_no_other_tenants(engine, tmp_path):
    """Events of one tenant that Postgres refuses or no bill may hold, then another
    tenant's: the other tenant's all land, each poisoned one is dead-lettered once with
    its reason, and nothing is left to retry."""
    other = str(uuid.uuid4())
    poisons = [poisoned(prompt_tokens=2 ** 70), poisoned(cost=Decimal("NaN")),
               poisoned(http_status=2 ** 40), poisoned(total_s=float("nan"))]
    good = [make_record(tenant_id=other) for _ in range(30)]
    writer = UsageWriter(engine, Outbox(tmp_path / "o.jsonl"), batch_size=50,
                         flush_interval_s=0.01)
    await writer.start()
    for record in poisons + good:
        writer.submit(record)
    await writer.flush()
    await writer.flush()
    await writer.stop()
    async with engine.connect() as conn:
        landed = set(await conn.scalars(select(UsageEvent.invocation_id).where(
            UsageEvent.tenant_id == other)))
    assert landed == {r.invocation_id for r in good}
    assert writer.outbox.depth == 0 and writer.pending == 0 and writer.healthy
    letters = {letter["record"]["invocation_id"]: letter["error"]
               for letter in writer.dead_letters.read()}
    assert len(letters) == len(writer.dead_letters.read()) == 4, "each dead-lettered once"
    reasons = [letters[r.invocation_id] for r in poisons]
    assert "out of int64 range" in reasons[0] and reasons[1] == "not billable: cost is NaN"
    assert "out of int32 range" in reasons[2] and reasons[3] == "not billable: total_s is nan"


async def test_replay_dead_letters_a_refused_record_and_goes_on(engine, tmp_path):
    """A refused record used to block the outbox forever."""
    outbox = Outbox(tmp_path / "o.jsonl")
    records = [make_record() for _ in range(9)]
    outbox.append(records[:4] + [poisoned(tenant_id="not-a-uuid")] + records[4:])
    writer = UsageWriter(engine, outbox, batch_size=4, flush_interval_s=0.01)
    assert await writer.replay_outbox()
    assert await count_rows(engine) == 9 and outbox.depth == 0
    assert len(writer.dead_letters.read()) == 1


async def test_memory_holds_at_most_buffer_max_events(engine, tmp_path):
    """Postgres too slow to keep up (here: the writer not running at all): a full buffer
    spills to the outbox instead of growing, and everything lands once it runs."""
    writer = UsageWriter(engine, Outbox(tmp_path / "o.jsonl"), batch_size=4,
                         flush_interval_s=0.01, buffer_max=10)
    records = [make_record() for _ in range(25)]
    for record in records:
        writer.submit(record)
        assert writer.pending < 10
    assert writer.outbox.depth == 20 and writer.metrics.usage_spilled._value.get() == 20
    await writer.start()
    await writer.stop()
    assert await count_rows(engine) == 25 and writer.outbox.depth == 0


async def test_a_blackholed_postgres_times_out_and_events_go_to_the_outbox(own_pg, own_engine,
                                                                          tmp_path):
    """SIGSTOPped, Postgres accepts connections and never answers: the connect and
    statement timeouts bound every wait, and the events are safe in the outbox."""
    engine = create_db_engine(own_pg.url, connect_timeout_s=1, statement_timeout_s=1,
                              pool_timeout_s=1)
    writer = UsageWriter(engine, Outbox(tmp_path / "o.jsonl"), batch_size=20,
                         flush_interval_s=0.01, retry_s=3600)
    try:
        await writer.start()
        writer.submit(make_record())
        await writer.flush()                     # a pooled connection exists
        records = [make_record() for _ in range(5)]
        with frozen(own_pg):
            for record in records:
                writer.submit(record)
            started = time.monotonic()
            await asyncio.wait_for(writer.flush(), 20)
            assert time.monotonic() - started < 10
            assert writer.outbox.depth == 5 and not writer.healthy
        assert await writer.replay_outbox()
        assert await count_rows(engine) == 6
    finally:
        await writer.stop()
        await engine.dispose()


async def test_the_outbox_directory_buffer_and_timeouts_are_settings(tmp_path):
    settings = Settings.from_env({
        "THAWPOOL_DATA_DIR": str(tmp_path / "data"), "THAWPOOL_OUTBOX_DIR": str(tmp_path / "ebs"),
        "THAWPOOL_USAGE_BUFFER_MAX": "500", "THAWPOOL_DB_CONNECT_TIMEOUT_S": "2",
        "THAWPOOL_DB_STATEMENT_TIMEOUT_S": "7", "THAWPOOL_DB_POOL_TIMEOUT_S": "3"})
    assert settings.outbox_path == tmp_path / "ebs" / "usage-outbox.jsonl"
    assert settings.dead_letter_path == tmp_path / "ebs" / "usage-dead-letters.jsonl"
    assert (settings.usage_buffer_max, settings.db_connect_timeout_s,
            settings.db_statement_timeout_s, settings.db_pool_timeout_s) == (500, 2, 7, 3)
    assert Settings.from_env({"THAWPOOL_DATA_DIR": str(tmp_path)}).outbox_path == \
        tmp_path / "usage-outbox.jsonl", "the data dir by default, where earlier versions kept it"


KILLED = """
import os, signal, sys
from controlplane.db import create_db_engine
from controlplane.billing.metering import UsageWriter
from controlplane.billing.outbox import Outbox
from tests.controlplane.support.usage import make_record
records = [make_record() for _ in range(int(sys.argv[2]))]
writer = UsageWriter(create_db_engine(sys.argv[3]), Outbox(sys.argv[1]))
for record in records:          # finished calls, still in memory: the writer never ran
    writer.submit(record)
print(" ".join(r.invocation_id for r in records), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


async def test_usage_still_in_memory_survives_a_killed_process(engine, db_url, tmp_path):
    """SIGKILL (the OOM killer) with events not yet written anywhere but memory: the
    journal the kernel kept brings them back at the next start, each once."""
    outbox_path = tmp_path / "outbox.jsonl"
    killed = await asyncio.create_subprocess_exec(
        sys.executable, "-c", KILLED, str(outbox_path), "30", db_url,
        cwd=Path(__file__).resolve().parents[2], stdout=asyncio.subprocess.PIPE)
    out, _ = await killed.communicate()
    assert killed.returncode == -signal.SIGKILL
    ids = out.decode().split()
    assert len(ids) == 30 and list(tmp_path.glob("usage-journal-*.log"))
    restarted = UsageWriter(engine, Outbox(outbox_path), batch_size=8, flush_interval_s=0.01)
    await restarted.start()
    restarted.submit(make_record())
    await restarted.stop()
    async with engine.connect() as conn:
        found = await conn.scalar(select(func.count()).select_from(UsageEvent).where(
            UsageEvent.invocation_id.in_(ids)))
    assert found == 30 and await count_rows(engine) == 31
    assert not list(tmp_path.glob("usage-journal-*.log")), "a journal is forgotten once written"


KILLED_MID_CALL = """
import os, signal, sys, time, dataclasses
from decimal import Decimal
from controlplane.billing.call_journal import Delivered
from controlplane.db import create_db_engine
from controlplane.billing.metering import UsageWriter
from controlplane.billing.outbox import Outbox
from controlplane.billing.pricing import Pricing
from tests.controlplane.support.usage import make_record
writer = UsageWriter(create_db_engine(sys.argv[2]), Outbox(sys.argv[1]))
whole, cut = make_record(completion_tokens=7), make_record(completion_tokens=0)
for call in (whole, cut):       # both opened as the gateway does: nothing delivered yet
    writer.calls.open(dataclasses.replace(call, status="error", completion_tokens=0), Pricing())
writer.calls.progress(cut.invocation_id, Delivered(10, 0, 4, 0.01, time.time()))
writer.submit(whole)            # metered, but killed before its close frame
print(whole.invocation_id, cut.invocation_id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


async def test_a_call_cut_by_a_killed_process_is_billed_what_it_delivered(engine, db_url, tmp_path):
    """The next start bills the cut call from the call journal (`recovered`, partial, the
    tokens of its last progress); a call whose own row was journaled keeps that row."""
    outbox_path = tmp_path / "outbox.jsonl"
    killed = await asyncio.create_subprocess_exec(
        sys.executable, "-c", KILLED_MID_CALL, str(outbox_path), db_url,
        cwd=Path(__file__).resolve().parents[2], stdout=asyncio.subprocess.PIPE)
    out, _ = await killed.communicate()
    assert killed.returncode == -signal.SIGKILL
    whole, cut = out.decode().split()
    restarted = UsageWriter(engine, Outbox(outbox_path), batch_size=8, flush_interval_s=0.01)
    await restarted.start()
    await restarted.stop()
    async with engine.connect() as conn:
        rows = {r.invocation_id: r for r in await conn.execute(select(UsageEvent).where(
            UsageEvent.invocation_id.in_([whole, cut])))}
    assert (rows[whole].status, rows[whole].completion_tokens, rows[whole].recovered) == ("ok", 7, False)
    assert (rows[cut].status, rows[cut].prompt_tokens, rows[cut].completion_tokens, rows[cut].recovered) == \
        ("partial", 10, 4, True)
    assert not list(tmp_path.glob("calls-journal-*.log")), "the call journal is forgotten once billed"


async def test_the_answer_caps_and_the_replica_dead_letters_are_settings(tmp_path):
    settings = Settings.from_env({
        "THAWPOOL_OUTBOX_DIR": str(tmp_path / "ebs"), "THAWPOOL_UPSTREAM_MAX_ANSWER_BYTES": "1000",
        "THAWPOOL_UPSTREAM_MAX_LINE_BYTES": "100"})
    assert (settings.upstream_max_answer_bytes, settings.upstream_max_line_bytes) == (1000, 100)
    assert settings.replica_dead_letter_path == tmp_path / "ebs" / "replica-event-dead-letters.jsonl"
    defaults = Settings.from_env({})
    assert (defaults.upstream_max_answer_bytes, defaults.upstream_max_line_bytes) == (32 << 20, 8 << 20)
