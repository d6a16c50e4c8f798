"""A book's rows in effect from a time on (the price book, the cost book): the past is
fixed, so a row not yet in effect can be withdrawn and one in effect cannot (it is
history: a new row replaces it from a later time)."""
from __future__ import annotations

from datetime import datetime
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.fields import is_uuid
from controlplane.store.errors import Conflict, NotFound
from controlplane.store.tables import GpuCost, Price

BookRow = TypeVar("BookRow", Price, GpuCost)


async def withdraw_scheduled(session: AsyncSession, table: type[BookRow], row_id: str, now: datetime,
                             *, noun: str, code: str) -> None:
    """Delete the row `row_id` of `table` if it takes effect after `now`; 404 for no such
    row, 409 `code` for one already in effect."""
    row = await session.get(table, row_id) if is_uuid(row_id) else None
    if row is None:
        raise NotFound(noun, row_id)
    if row.effective_from <= now:
        raise Conflict(code, f"a {noun} in effect is history: add a new row instead")
    await session.delete(row)
