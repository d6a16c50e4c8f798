"""The operator's cost book in Postgres: what one GPU-second of each kind costs the
platform (controlplane.billing.costs), each row in effect from its `effective_from` on.

Like the price book, the past is fixed: a row takes effect now or later, and only a row
not yet in effect can be deleted, so no change of the book recomputes a margin already
reported. The default row (no kind) is seeded from the settings at the first start
(`seed_default`); after that the book, not the settings, holds it.
"""
from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Optional

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.billing.costs import CostRow
from controlplane.store.book_rows import withdraw_scheduled
from controlplane.store.errors import AlreadyExists
from controlplane.store.prices import EPOCH
from controlplane.store.tables import GpuCost, new_id, utcnow


def cost_row(row: GpuCost) -> CostRow:
    return CostRow(row.gpu_kind, row.effective_from, row.per_gpu_second)


async def seed_default(session: AsyncSession, per_gpu_second: Decimal) -> None:
    """The settings' cost as the default from the epoch on, when the book has none (two
    control planes starting at once both insert the same row; one wins)."""
    has_default = await session.scalar(
        select(GpuCost.id).where(GpuCost.gpu_kind.is_(None)).limit(1))
    if has_default is None:
        await session.execute(insert(GpuCost).values(
            id=new_id(), gpu_kind=None, per_gpu_second=per_gpu_second, effective_from=EPOCH,
            created_at=utcnow()).on_conflict_do_nothing())


async def add(session: AsyncSession, gpu_kind: Optional[str], per_gpu_second: Decimal,
              effective_from: datetime) -> GpuCost:
    row = GpuCost(gpu_kind=gpu_kind, per_gpu_second=per_gpu_second,
                  effective_from=effective_from)
    try:
        async with session.begin_nested():
            session.add(row)
    except IntegrityError:
        raise AlreadyExists("gpu cost", f"{gpu_kind or '(default)'} effective from "
                                        f"{effective_from.isoformat()}") from None
    return row


async def book(session: AsyncSession) -> list[GpuCost]:
    """Every row: the default's first, then by kind, each kind's by time."""
    return list(await session.scalars(select(GpuCost).order_by(
        GpuCost.gpu_kind.nulls_first(), GpuCost.effective_from)))


async def cost_rows(session: AsyncSession) -> list[CostRow]:
    return [cost_row(r) for r in await book(session)]


async def delete_scheduled(session: AsyncSession, cost_id: str, now: datetime) -> None:
    await withdraw_scheduled(session, GpuCost, cost_id, now, noun="gpu cost", code="cost_in_effect")
