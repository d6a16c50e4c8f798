"""Files, batches and batch lines in Postgres (batch_files, batches, batch_lines:
migration 0023). Another tenant's file or batch is simply not found. Lines are claimed
with FOR UPDATE SKIP LOCKED, so runners never take the same line; a line ends (its
result and its status together) only while it is still `running`."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional, Sequence

from sqlalchemy import and_, delete, func, insert, or_, select, tuple_, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.store.errors import NotFound
from controlplane.store.tables import ApiKey, Batch, BatchFile, BatchLine, Tenant
from controlplane.store.tenants import Principal

OPEN = ("in_progress", "cancelling")


async def add_file(session: AsyncSession, row: BatchFile) -> None:
    """Once: a file written again (a batch finalized twice) keeps its first row."""
    await session.execute(pg_insert(BatchFile).values(
        id=row.id, tenant_id=row.tenant_id, purpose=row.purpose, filename=row.filename,
        bytes=row.bytes, object_key=row.object_key, created_at=row.created_at)
        .on_conflict_do_nothing(index_elements=["id"]))


async def find_file(session: AsyncSession, tenant_id: str, file_id: str) -> BatchFile:
    row = await session.scalar(select(BatchFile).where(BatchFile.id == file_id,
                                                       BatchFile.tenant_id == tenant_id))
    if row is None:
        raise NotFound("file", file_id)
    return row


async def list_files(session: AsyncSession, tenant_id: str, purpose: Optional[str],
                     limit: int) -> list[BatchFile]:
    query = select(BatchFile).where(BatchFile.tenant_id == tenant_id)
    if purpose is not None:
        query = query.where(BatchFile.purpose == purpose)
    return list(await session.scalars(query.order_by(BatchFile.created_at.desc()).limit(limit)))


async def delete_file(session: AsyncSession, file_id: str) -> None:
    await session.execute(delete(BatchFile).where(BatchFile.id == file_id))


async def add_batch(session: AsyncSession, batch: Batch, lines: Sequence[dict[str, Any]]) -> None:
    """The batch and its lines (dicts of BatchLine's columns) in the caller's transaction."""
    session.add(batch)
    await session.flush()
    for start in range(0, len(lines), 1000):
        await session.execute(insert(BatchLine), list(lines[start:start + 1000]))


async def find_batch(session: AsyncSession, tenant_id: str, batch_id: str,
                     for_update: bool = False) -> Batch:
    query = select(Batch).where(Batch.id == batch_id, Batch.tenant_id == tenant_id)
    batch = await session.scalar(query.with_for_update() if for_update else query)
    if batch is None:
        raise NotFound("batch", batch_id)
    return batch


async def list_batches(session: AsyncSession, tenant_id: str, limit: int,
                       after: Optional[Batch]) -> list[Batch]:
    """Newest first; `after`: the page after that batch (OpenAI's cursor)."""
    query = select(Batch).where(Batch.tenant_id == tenant_id)
    if after is not None:
        query = query.where(tuple_(Batch.created_at, Batch.id) < (after.created_at, after.id))
    return list(await session.scalars(
        query.order_by(Batch.created_at.desc(), Batch.id.desc()).limit(limit)))


async def line_counts(session: AsyncSession, batch_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """batch id -> line status -> how many."""
    rows = await session.execute(
        select(BatchLine.batch_id, BatchLine.status, func.count())
        .where(BatchLine.batch_id.in_(batch_ids)).group_by(BatchLine.batch_id, BatchLine.status))
    counts: dict[str, dict[str, int]] = {b: {} for b in batch_ids}
    for batch_id, status, n in rows:
        counts[batch_id][status] = n
    return counts


@dataclass(frozen=True)
class OpenBatch:
    batch: Batch
    pending: int
    running: int


async def open_batches(session: AsyncSession) -> list[OpenBatch]:
    """Every batch still in progress or cancelling, with its lines waiting and running."""
    batches = list(await session.scalars(select(Batch).where(Batch.status.in_(OPEN))))
    counts = await line_counts(session, [b.id for b in batches])
    return [OpenBatch(b, counts[b.id].get("pending", 0), counts[b.id].get("running", 0))
            for b in batches]


async def end_pending(session: AsyncSession, batch_id: str, status: str) -> None:
    """Lines not started end unrun (expired or cancelled); their error lines are
    derived from that status when the files are written."""
    await session.execute(update(BatchLine).where(
        BatchLine.batch_id == batch_id, BatchLine.status == "pending").values(status=status))


async def reset_running(session: AsyncSession) -> int:
    """Lines a killed control plane left running are run again (under the same
    invocation id: a call it had sent is billed once)."""
    reset = await session.execute(update(BatchLine).where(BatchLine.status == "running")
                                  .values(status="pending").returning(BatchLine.line))
    return len(reset.all())


def _due(now: datetime) -> Any:
    return and_(BatchLine.status == "pending",
                or_(BatchLine.not_before.is_(None), BatchLine.not_before <= now),
                Batch.status == "in_progress", Batch.expires_at > now)


async def pending_models(session: AsyncSession, now: datetime) -> list[tuple[str, str]]:
    """(tenant id, model) of every line due to run."""
    rows = await session.execute(
        select(Batch.tenant_id, BatchLine.model).join(Batch, Batch.id == BatchLine.batch_id)
        .where(_due(now)).distinct())
    return [(tenant, model) for tenant, model in rows if model is not None]


@dataclass(frozen=True)
class Claimed:
    batch_id: str
    line: int
    custom_id: str
    body: str
    attempts: int                 # this one included


async def claim(session: AsyncSession, tenant_id: str, model: str, limit: int,
                now: datetime) -> list[Claimed]:
    """Up to `limit` due lines of the tenant on `model`, oldest batch first, in input
    order, now running."""
    chosen = (select(BatchLine.batch_id, BatchLine.line).join(Batch, Batch.id == BatchLine.batch_id)
              .where(_due(now), Batch.tenant_id == tenant_id, BatchLine.model == model)
              .order_by(Batch.created_at, BatchLine.batch_id, BatchLine.line).limit(limit)
              .with_for_update(of=BatchLine, skip_locked=True))
    rows = await session.execute(
        update(BatchLine).where(tuple_(BatchLine.batch_id, BatchLine.line).in_(chosen))
        .values(status="running", attempts=BatchLine.attempts + 1)
        .returning(BatchLine.batch_id, BatchLine.line, BatchLine.custom_id, BatchLine.body,
                   BatchLine.attempts))
    # a pending line has a custom_id and a body (only a line refused at create lacks them)
    return sorted((Claimed(b, n, custom_id or "", body or "{}", attempts)
                   for b, n, custom_id, body, attempts in rows), key=lambda c: (c.batch_id, c.line))


async def finish_line(session: AsyncSession, batch_id: str, line: int, status: str,
                      result: str) -> bool:
    """The line's result and its end, together; False when it was no longer running."""
    done = await session.execute(
        update(BatchLine).where(BatchLine.batch_id == batch_id, BatchLine.line == line,
                                BatchLine.status == "running")
        .values(status=status, result=result).returning(BatchLine.line))
    return done.first() is not None


async def retry_line(session: AsyncSession, batch_id: str, line: int, not_before: datetime,
                     counts_as_attempt: bool) -> None:
    attempts = BatchLine.attempts if counts_as_attempt else BatchLine.attempts - 1
    await session.execute(
        update(BatchLine).where(BatchLine.batch_id == batch_id, BatchLine.line == line,
                                BatchLine.status == "running")
        .values(status="pending", not_before=not_before, attempts=attempts))


async def lines_of(session: AsyncSession, batch_id: str) -> list[BatchLine]:
    """Every line of the batch, in input order."""
    return list(await session.scalars(select(BatchLine).where(BatchLine.batch_id == batch_id)
                                      .order_by(BatchLine.line)))


async def principal_of(session: AsyncSession, batch: Batch) -> Principal:
    """The key that created the batch, as its lines' caller: its limits, its usage rows."""
    row = (await session.execute(
        select(ApiKey, Tenant.name).join(Tenant, Tenant.id == ApiKey.tenant_id)
        .where(ApiKey.id == batch.api_key_id))).first()
    if row is None:
        raise NotFound("key", batch.api_key_id)
    key, tenant_name = row
    return Principal(key.id, key.prefix, key.tenant_id, tenant_name, frozenset(key.scopes),
                     key.requests_per_min, key.tokens_per_min)


async def find_by_id(session: AsyncSession, batch_id: str) -> Optional[Batch]:
    """Any tenant's batch: for the runner, never for a route."""
    return await session.scalar(select(Batch).where(Batch.id == batch_id))


async def end_batch(session: AsyncSession, batch_id: str, status: str, output_file_id: Optional[str],
                    error_file_id: Optional[str], now: datetime) -> None:
    """Its final status, once (a batch already ended keeps its first)."""
    stamps = {"completed": "completed_at", "expired": "expired_at", "cancelled": "cancelled_at"}
    await session.execute(
        update(Batch).where(Batch.id == batch_id, Batch.status.in_(OPEN))
        .values(status=status, output_file_id=output_file_id, error_file_id=error_file_id,
                finalizing_at=now, **{stamps[status]: now}))
