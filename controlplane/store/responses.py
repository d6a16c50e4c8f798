"""Stored Responses API answers in Postgres (`stored_responses`): one row per response made
with `store`, read by its tenant only (another tenant's id reads as missing), deleted by
its tenant or once its retention has passed (the cutoff is the caller's to compute)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional

from sqlalchemy import delete, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.store.tables import StoredResponse

RESPONSE_ID = re.compile(r"resp_[0-9a-f]{32}")


@dataclass(frozen=True)
class Stored:
    """A response as kept: the chat messages its turn answered, and the response object."""
    id: str
    tenant_id: str
    model: str
    conversation: list[dict[str, Any]]
    response: dict[str, Any]
    created_at: datetime


async def add(session: AsyncSession, stored: Stored) -> None:
    await session.execute(insert(StoredResponse).values(
        id=stored.id, tenant_id=stored.tenant_id, model=stored.model,
        conversation=_text(stored.conversation), response=_text(stored.response),
        created_at=stored.created_at))


async def find(session: AsyncSession, tenant_id: str, response_id: str,
               cutoff: datetime) -> Optional[Stored]:
    """The tenant's response made after `cutoff` (an older one is expired, even before the
    sweep deletes it); another tenant's is None."""
    if not RESPONSE_ID.fullmatch(response_id):
        return None
    row = await session.scalar(select(StoredResponse).where(
        StoredResponse.id == response_id, StoredResponse.tenant_id == tenant_id,
        StoredResponse.created_at > cutoff))
    if row is None:
        return None
    return Stored(row.id, row.tenant_id, row.model, json.loads(row.conversation), json.loads(row.response),
                  row.created_at)


async def remove(session: AsyncSession, tenant_id: str, response_id: str, cutoff: datetime) -> bool:
    """Deletes the tenant's response made after `cutoff`; False when it has no such one."""
    deleted = await session.execute(
        delete(StoredResponse).where(StoredResponse.id == response_id, StoredResponse.tenant_id == tenant_id,
                                     StoredResponse.created_at > cutoff)
        .returning(StoredResponse.id))
    return deleted.first() is not None


async def delete_expired(session: AsyncSession, cutoff: datetime, limit: int) -> int:
    """Deletes up to `limit` responses made at or before `cutoff`; how many it deleted.
    SKIP LOCKED: two control planes sweeping at once split the rows."""
    doomed = (select(StoredResponse.id).where(StoredResponse.created_at <= cutoff)
              .limit(limit).with_for_update(skip_locked=True))
    deleted = await session.execute(
        delete(StoredResponse).where(StoredResponse.id.in_(doomed.scalar_subquery()))
        .returning(StoredResponse.id))
    return len(deleted.all())


def _text(value: Any) -> str:
    """ASCII JSON: no NUL or lone surrogate a model wrote can reach Postgres."""
    return json.dumps(value)
