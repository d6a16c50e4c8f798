"""The usage write path: batched, idempotent inserts, with a durable outbox fallback.

submit() only appends to memory. A writer task flushes a batch when it is full
or `flush_interval_s` after the first event of a batch arrived; an event leaves
memory only after its transaction committed, or after it was fsynced into the
outbox because Postgres was unreachable. The outbox is replayed when Postgres
answers again and at every start.
"""
from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timezone
from typing import Any, Optional

from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.metrics import Metrics
from controlplane.models import UsageEvent
from controlplane.outbox import Outbox
from controlplane.usage import FIELD_NAMES, UsageRecord

log = logging.getLogger("thawpool.metering")


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


async def insert_usage(db_engine: AsyncEngine, records: list[UsageRecord]) -> None:
    """One statement, hence one transaction, for the whole batch (asyncpg underneath)."""
    columns = [[getattr(r, name) for r in records] for name in FIELD_NAMES]
    async with db_engine.connect() as conn:
        asyncpg_connection: Any = (await conn.get_raw_connection()).driver_connection
        await asyncpg_connection.execute(UNNEST_INSERT, *columns)


class UsageWriter:
    def __init__(self, db_engine: AsyncEngine, outbox: Outbox, metrics: Optional[Metrics] = None,
                 *, batch_size: int = 1000, flush_interval_s: float = 0.05,
                 retry_s: float = 1.0):
        self.db_engine = db_engine
        self.outbox = outbox
        self.metrics = metrics or Metrics()
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.retry_s = retry_s
        self._buffer: list[UsageRecord] = []
        self._wake = asyncio.Event()       # the first event of a batch, or stop()
        self._full = asyncio.Event()       # a full batch, or stop(): end the gathering wait
        self._task: Optional[asyncio.Task[None]] = None
        self._stopping = False
        self._db_down_since: Optional[float] = None
        self._lock = asyncio.Lock()
        self.metrics.outbox_depth.set(outbox.depth)

    @property
    def pending(self) -> int:
        return len(self._buffer)

    @property
    def healthy(self) -> bool:
        return self._db_down_since is None

    def submit(self, record: UsageRecord) -> None:
        self._buffer.append(record)
        self.metrics.usage_pending.set(len(self._buffer))
        if len(self._buffer) == 1:
            self._wake.set()
        if len(self._buffer) >= self.batch_size:
            self._wake.set()
            self._full.set()

    async def start(self) -> None:
        await self.replay_outbox()
        self._task = asyncio.create_task(self._run(), name="usage-writer")

    async def stop(self) -> None:
        """Flush everything: into Postgres, or into the outbox when it is away."""
        self._stopping = True
        self._wake.set()
        self._full.set()
        if self._task is not None:
            await self._task
            self._task = None
        await self.flush()

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
        while self._buffer:
            batch = self._buffer[:self.batch_size]
            if self._db_down_since is not None and not self._retry_due():
                await asyncio.to_thread(self.outbox.append, batch)
            elif not await self._write(batch):
                await asyncio.to_thread(self.outbox.append, batch)
            del self._buffer[:len(batch)]
            self.metrics.usage_pending.set(len(self._buffer))
            self.metrics.outbox_depth.set(self.outbox.depth)

    async def _write(self, batch: list[UsageRecord]) -> bool:
        try:
            await insert_usage(self.db_engine, batch)
        except Exception as exc:  # noqa: BLE001 - unreachable or failing: keep the events
            if self._db_down_since is None:
                log.warning("postgres unreachable, usage events go to the outbox",
                            extra={"error": repr(exc)[:300], "events": len(batch)})
            self._db_down_since = time.monotonic()
            return False
        if self._db_down_since is not None:
            log.info("postgres reachable again")
        self._db_down_since = None
        now = datetime.now(timezone.utc)
        for record in batch:
            self.metrics.usage_write_lag.observe(max(0.0, (now - record.finished_at).total_seconds()))
        self.metrics.usage_written.inc(len(batch))
        return True

    async def _replay(self) -> bool:
        records = await asyncio.to_thread(self.outbox.read)
        for start in range(0, len(records), self.batch_size):
            if not await self._write(records[start:start + self.batch_size]):
                return False
        if records:
            log.info("outbox replayed", extra={"events": len(records)})
        await asyncio.to_thread(self.outbox.clear)
        self.metrics.outbox_depth.set(0)
        return True
