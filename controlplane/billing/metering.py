"""The usage write path: batched, idempotent inserts, with a durable outbox fallback.

submit() only appends to memory (and to the journal, outbox.Journal: a copy a
killed process leaves behind for the next start). A writer task flushes a batch
when it is full or `flush_interval_s` after the first event of a batch arrived;
an event leaves memory only after its transaction committed, or after it was
fsynced into the outbox because Postgres was unreachable. Memory holds at most
`buffer_max` events: a full buffer (Postgres slow, or blackholed until the
statement timeout) is spilled to the outbox at once. The outbox is replayed when
Postgres answers again and at every start. An event Postgres refuses for good (a
data error, not an outage) goes to the dead-letter file with an alert, and the
rest go on.

The transaction that inserts a batch also settles the budget reservations of the rows
it really inserted (controlplane.budgets.ledger); the thresholds that spend crossed go
to the alert sink once it committed.
"""
from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timezone
from typing import Any, Optional

from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.billing.call_journal import CallJournal, recover
from controlplane.budgets.alerts import BudgetAlert, BudgetAlertSink, LoggingAlertSink, hand_over
from controlplane.budgets.ledger import settle
from controlplane.metrics import Metrics
from controlplane.store.tables import UsageEvent
from controlplane.billing.outbox import DeadLetters, Journal, Outbox
from controlplane.store.failures import is_refusal
from controlplane.billing.usage import FIELD_NAMES, UsageRecord

log = logging.getLogger("thawpool.metering")
DEAD_LETTER_FILE = "usage-dead-letters.jsonl"


def _unnest_insert() -> str:
    """INSERT ... SELECT FROM unnest($1::uuid[], ...) ON CONFLICT DO NOTHING: one array
    per column, so a batch is one statement with 23 parameters, whatever its size."""
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]  # untyped in SQLAlchemy
    columns = UsageEvent.__table__.columns
    casts = ", ".join(f"${i}::{columns[name].type.compile(dialect=dialect)}[]"
                      for i, name in enumerate(FIELD_NAMES, 1))
    return (f"INSERT INTO {UsageEvent.__tablename__} ({', '.join(FIELD_NAMES)}) "
            f"SELECT * FROM unnest({casts}) ON CONFLICT (invocation_id) DO NOTHING")


UNNEST_INSERT = _unnest_insert()
# The rows inserted (not those already there) take their budget reservations with them,
# and the paid rows of a budgeted tenant that had none (served while Postgres was away,
# admitted before its budget existed, recovered after the reservation was forgotten) come
# back whole: what `settle` adds to the budgets' spend.
INSERT_AND_SETTLE = (
    f"WITH inserted AS ({UNNEST_INSERT} RETURNING invocation_id, tenant_id, api_key_id, deployment_id, "
    "started_at, cost), "
    "settled AS (DELETE FROM budget_reservations r USING inserted i WHERE r.invocation_id = i.invocation_id "
    "RETURNING r.invocation_id, r.budget_id, r.period_start, r.amount, r.expired, i.cost) "
    "SELECT budget_id, period_start, amount, expired, cost, NULL::uuid AS tenant_id, NULL::uuid AS api_key_id, "
    "NULL::uuid AS deployment_id, NULL::timestamptz AS started_at FROM settled "
    "UNION ALL SELECT NULL, NULL, NULL, NULL, i.cost, i.tenant_id, i.api_key_id, i.deployment_id, i.started_at "
    "FROM inserted i WHERE i.cost > 0 AND EXISTS (SELECT 1 FROM budgets b WHERE b.tenant_id = i.tenant_id) "
    "AND NOT EXISTS (SELECT 1 FROM settled s WHERE s.invocation_id = i.invocation_id)")


async def insert_usage(db_engine: AsyncEngine, records: list[UsageRecord]) -> list[BudgetAlert]:
    """One transaction for the whole batch (asyncpg underneath): its rows, and the budget
    spend they settle; the budget thresholds crossed by it."""
    columns = [[getattr(r, name) for r in records] for name in FIELD_NAMES]
    async with db_engine.connect() as conn:
        asyncpg_connection: Any = (await conn.get_raw_connection()).driver_connection
        async with asyncpg_connection.transaction():
            settled = await asyncpg_connection.fetch(INSERT_AND_SETTLE, *columns)
            return await settle(asyncpg_connection, settled, datetime.now(timezone.utc))


class UsageWriter:
    def __init__(self, db_engine: AsyncEngine, outbox: Outbox, metrics: Optional[Metrics] = None,
                 *, batch_size: int = 1000, flush_interval_s: float = 0.05,
                 retry_s: float = 1.0, buffer_max: int = 10_000,
                 dead_letters: Optional[DeadLetters] = None, journal: Optional[Journal] = None,
                 calls: Optional[CallJournal] = None, alerts: Optional[BudgetAlertSink] = None):
        self.db_engine = db_engine
        self.alerts: BudgetAlertSink = alerts or LoggingAlertSink()
        self.outbox = outbox
        self.dead_letters = dead_letters or DeadLetters(outbox.path.parent / DEAD_LETTER_FILE)
        self.journal = journal or Journal(outbox.path.parent)
        self.calls = calls or CallJournal(outbox.path.parent)    # the gateway writes it
        self.metrics = metrics or Metrics()
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.retry_s = retry_s
        self.buffer_max = buffer_max
        self._buffer: list[UsageRecord] = []
        self._in_flight = 0                # events of the batch being written now
        self._wake = asyncio.Event()       # the first event of a batch, or stop()
        self._full = asyncio.Event()       # a full batch, or stop(): end the gathering wait
        self._task: Optional[asyncio.Task[None]] = None
        self._stopping = False
        self._db_down_since: Optional[float] = None
        self._lock = asyncio.Lock()
        self.metrics.outbox_depth.set(outbox.depth)

    @property
    def pending(self) -> int:
        return len(self._buffer) + self._in_flight

    @property
    def healthy(self) -> bool:
        return self._db_down_since is None

    def submit(self, record: UsageRecord) -> None:
        """Into memory; a buffer at `buffer_max` (Postgres slow or away) goes to the outbox
        at once, so memory never holds more than that. The journal keeps a copy that
        outlives a killed process."""
        self.journal.append(record)
        self._buffer.append(record)
        if len(self._buffer) >= self.buffer_max:
            self._spill()
        self.metrics.usage_pending.set(len(self._buffer))
        if len(self._buffer) == 1:
            self._wake.set()
        if len(self._buffer) >= self.batch_size:
            self._wake.set()
            self._full.set()

    def _spill(self) -> None:
        spilled, self._buffer = self._buffer, []
        self.outbox.append(spilled)        # fsync on the loop: once per buffer_max events
        self.metrics.usage_spilled.inc(len(spilled))
        self.metrics.outbox_depth.set(self.outbox.depth)
        log.warning("usage buffer full, spilled to the outbox", extra={"events": len(spilled)})

    async def start(self) -> None:
        await asyncio.to_thread(self._recover_journal)
        await self.replay_outbox()
        self._task = asyncio.create_task(self._run(), name="usage-writer")

    def _recover_journal(self) -> None:
        """Events an earlier process held in memory when it died, then the rows of the
        calls it was serving: into the outbox, in that order (a call whose own row was
        journaled keeps it: the row replayed first wins its invocation id)."""
        segments = self.journal.leftovers()
        found = Journal.read(segments)
        self.outbox.append(found.records)
        if found.corrupt:
            self.dead_letters.add_corrupt(found.corrupt, "journal line failed its check")
        for segment in segments:
            segment.unlink()
        if found.records:
            log.warning("recovered usage events a stopped process held in memory",
                        extra={"events": len(found.records)})
        self._recover_cut_calls()

    def _recover_cut_calls(self) -> None:
        segments = self.calls.leftovers()
        rows, corrupt = recover(segments)
        self.outbox.append(rows)
        for segment in segments:
            segment.unlink()
        if rows:
            log.warning("billed the calls a stopped process was serving, for what they delivered",
                        extra={"events": len(rows), "corrupt_lines": corrupt})

    async def stop(self) -> None:
        """Flush everything: into Postgres, or into the outbox when it is away."""
        self._stopping = True
        self._wake.set()
        self._full.set()
        if self._task is not None:
            await self._task
            self._task = None
        await self.flush()
        self.calls.shut()

    async def flush(self) -> None:
        async with self._lock:
            await self._drain()
            if self.outbox.depth and self._db_down_since is None:
                await self._replay()

    async def replay_outbox(self) -> bool:
        async with self._lock:
            return await self._replay()

    async def _run(self) -> None:
        while not self._stopping:
            timeout = self.retry_s if self.outbox.depth else None
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            await self._gather()
            try:
                async with self._lock:
                    await self._drain()
                    if self.outbox.depth and self._retry_due():
                        await self._replay()
            except Exception:  # noqa: BLE001 - the writer must outlive any one failure
                log.exception("usage writer iteration failed")

    async def _gather(self) -> None:
        """Let a batch gather for flush_interval_s; a batch that fills or stop() ends the
        wait at once."""
        self._full.clear()
        if len(self._buffer) >= self.batch_size or self._stopping:
            return
        try:
            await asyncio.wait_for(self._full.wait(), self.flush_interval_s)
        except asyncio.TimeoutError:
            pass

    def _retry_due(self) -> bool:
        return (self._db_down_since is None
                or time.monotonic() - self._db_down_since >= self.retry_s)

    async def _drain(self) -> None:
        """Each batch leaves the buffer for Postgres, or for the outbox when it is away;
        then the journal of what was in memory is forgotten."""
        sealed = self.journal.seal()
        while self._buffer:
            batch = self._buffer[:self.batch_size]
            del self._buffer[:len(batch)]
            self._in_flight = len(batch)
            try:
                if not (self._retry_due() and await self._write(batch)):
                    await asyncio.to_thread(self.outbox.append, batch)
            finally:
                self._in_flight = 0
            self.metrics.usage_pending.set(len(self._buffer))
            self.metrics.outbox_depth.set(self.outbox.depth)
        self.journal.forget(sealed)

    async def _write(self, batch: list[UsageRecord]) -> bool:
        """True once every event is committed or dead-lettered; False: Postgres is away."""
        if any(record.not_billable() for record in batch):
            batch = await self._set_apart(batch)
            if not batch:
                return True
        try:
            crossed = await insert_usage(self.db_engine, batch)
        except Exception as exc:  # noqa: BLE001 - classified: refused, or away
            if is_refusal(exc):
                return await self._write_apart(batch, exc)
            self._down(exc, len(batch))
            return False
        self._up(batch)
        await hand_over(self.alerts, crossed)
        return True

    async def _write_apart(self, batch: list[UsageRecord], exc: Exception) -> bool:
        """Postgres refused the batch: halves until the refused events are alone, and those
        go to the dead-letter file, so one bad event never holds up the rest."""
        if len(batch) > 1:
            half = len(batch) // 2
            return await self._write(batch[:half]) and await self._write(batch[half:])
        await asyncio.to_thread(self.dead_letters.add, batch, repr(exc)[:500])
        self.metrics.usage_dead_letters.inc()
        log.error("ALERT usage event refused by postgres, moved to the dead-letter file",
                  extra={"alert": "usage_dead_letter", "invocation_id": batch[0].invocation_id,
                         "error": repr(exc)[:300], "path": str(self.dead_letters.path)})
        return True

    async def _set_apart(self, batch: list[UsageRecord]) -> list[UsageRecord]:
        """The events Postgres would take but no bill may hold (a NaN cost or time) go to
        the dead-letter file; the rest are written."""
        kept = []
        for record in batch:
            reason = record.not_billable()
            if reason is None:
                kept.append(record)
                continue
            await asyncio.to_thread(self.dead_letters.add, [record], f"not billable: {reason}")
            self.metrics.usage_dead_letters.inc()
            log.error("ALERT usage event not billable, moved to the dead-letter file",
                      extra={"alert": "usage_dead_letter", "invocation_id": record.invocation_id,
                             "error": reason, "path": str(self.dead_letters.path)})
        return kept

    def _down(self, exc: Exception, events: int) -> None:
        if self._db_down_since is None:
            log.warning("postgres unreachable, usage events go to the outbox",
                        extra={"error": repr(exc)[:300], "events": events})
        self._db_down_since = time.monotonic()

    def _up(self, batch: list[UsageRecord]) -> None:
        if self._db_down_since is not None:
            log.info("postgres reachable again")
        self._db_down_since = None
        now = datetime.now(timezone.utc)
        for record in batch:
            self.metrics.usage_write_lag.observe(max(0.0, (now - record.finished_at).total_seconds()))
        self.metrics.usage_written.inc(len(batch))

    async def _replay(self) -> bool:
        """The outbox, batch by batch; what was written is dropped from it even when
        Postgres goes away midway, so a long outbox is never replayed from the start."""
        offset, replayed, done = 0, 0, True
        while True:
            batch = await asyncio.to_thread(self.outbox.read_batch, offset, self.batch_size)
            if batch.corrupt:
                await self._dead_letter_corrupt(batch.corrupt)
            if batch.records and not await self._write(batch.records):
                done = False
                break
            replayed += len(batch.records)
            if batch.end == offset:
                break
            offset = batch.end
        await asyncio.to_thread(self.outbox.drop_before, offset)
        self.metrics.outbox_depth.set(self.outbox.depth)
        if replayed:
            log.info("outbox replayed", extra={"events": replayed, "complete": done})
        return done

    async def _dead_letter_corrupt(self, lines: list[bytes]) -> None:
        await asyncio.to_thread(self.dead_letters.add_corrupt, lines,
                                "outbox line failed its length or checksum check")
        self.metrics.usage_dead_letters.inc(len(lines))
        log.error("ALERT outbox lines failed their checksum, moved to the dead-letter file",
                  extra={"alert": "usage_dead_letter", "lines": len(lines),
                         "path": str(self.dead_letters.path)})
