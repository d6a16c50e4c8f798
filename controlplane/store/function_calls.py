"""Asynchronous function calls in Postgres (`function_calls`): one row per call, from its
acceptance to the end of its retention. What is expired and when is decided by
controlplane.gateway.async_call_rules; these queries take its answers (a cutoff, a limit) as given."""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Optional

from sqlalchemy import delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.gateway.async_call_rules import RUNNING, StoredCall, is_call_id
from controlplane.store.tables import FunctionCall


async def add(session: AsyncSession, call: StoredCall) -> None:
    """The call as accepted: running (`finish` records its end)."""
    await session.execute(insert(FunctionCall).values(
        id=call.id, tenant_id=call.tenant_id, deployment_name=call.deployment, status=RUNNING,
        created_at=call.created_at))


async def finish(session: AsyncSession, call: StoredCall) -> bool:
    """Records the end of a running call; False when it is no longer running (a restart
    marked it failed) or gone."""
    done = await session.execute(
        update(FunctionCall).where(FunctionCall.id == call.id, FunctionCall.status == RUNNING)
        .values(status=call.status, http_status=call.http_status, body=_text(call.body),
                finished_at=call.finished_at).returning(FunctionCall.id))
    return done.first() is not None


async def find(session: AsyncSession, tenant_id: str, call_id: str) -> Optional[StoredCall]:
    """The tenant's call, expired or not (the caller decides); another tenant's is None."""
    if not is_call_id(call_id):
        return None
    row = await session.scalar(select(FunctionCall).where(FunctionCall.id == call_id,
                                                          FunctionCall.tenant_id == tenant_id))
    return None if row is None else _call(row)


async def fail_running(session: AsyncSession, http_status: int, body: dict[str, Any],
                       now: datetime) -> int:
    """Every running call ends failed with this answer: how many there were."""
    failed = await session.execute(
        update(FunctionCall).where(FunctionCall.finished_at.is_(None))
        .values(status="failed", http_status=http_status, body=_text(body), finished_at=now)
        .returning(FunctionCall.id))
    return len(failed.all())


async def delete_expired(session: AsyncSession, cutoff: datetime, limit: int) -> int:
    """Deletes up to `limit` calls that ended at or before `cutoff`; how many it deleted.
    SKIP LOCKED: two sweeps at once split the rows instead of waiting on each other."""
    doomed = (select(FunctionCall.id).where(FunctionCall.finished_at <= cutoff)
              .limit(limit).with_for_update(skip_locked=True))
    deleted = await session.execute(
        delete(FunctionCall).where(FunctionCall.id.in_(doomed.scalar_subquery()))
        .returning(FunctionCall.id))
    return len(deleted.all())


def _call(row: FunctionCall) -> StoredCall:
    body = None if row.body is None else json.loads(row.body)
    return StoredCall(row.id, row.tenant_id, row.deployment_name, row.created_at, row.status,
                      row.finished_at, row.http_status, body)


def _text(body: Optional[dict[str, Any]]) -> Optional[str]:
    """ASCII JSON: no NUL or lone surrogate can reach Postgres, whatever the function said."""
    return None if body is None else json.dumps(body)
