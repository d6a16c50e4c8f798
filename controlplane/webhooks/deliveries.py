"""Deliveries in Postgres: claiming the due ones, recording each attempt, listing them.

Several control planes share the table. A worker claims due deliveries with
`FOR UPDATE SKIP LOCKED` (two never claim one row), counts the attempt, stamps a fresh
`claim_id` and moves `next_attempt_at` past a lease, then commits: the POST happens
outside any transaction, and a control plane that dies mid-POST leaves the delivery due
again once the lease ends (so a receiver may see an event twice: it dedupes by the
event id). Only the claim's holder records its attempt.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Optional

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.store.tables import WebhookAttempt, WebhookDelivery, WebhookEndpoint, WebhookEvent
from controlplane.webhooks.backoff import RetryPolicy, retry_at
from controlplane.webhooks.events import event_body

MAX_ERROR = 500


@dataclass(frozen=True)
class Claimed:
    """What one POST needs: where, what (the exact bytes), and with which secret."""
    delivery_id: str
    claim_id: str
    attempt: int                     # 1 for the first
    event_id: str
    event_type: str
    event_created_at: datetime
    body: bytes
    url: str
    endpoint_id: str
    secret_sealed: bytes
    operator: bool                   # the operator's endpoint (may reach private addresses)


@dataclass(frozen=True)
class Attempt:
    started_at: datetime
    duration_ms: float
    status_code: Optional[int]       # None: no answer (error says why)
    error: Optional[str]

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


@dataclass(frozen=True)
class Next:
    status: str                      # pending | succeeded | failed
    at: Optional[datetime]           # when pending: the next attempt


def after(attempt: Attempt, claimed: Claimed, policy: RetryPolicy, now: datetime,
          jitter: float) -> Next:
    """What follows an attempt: done, again at a time, or given up."""
    if attempt.ok:
        return Next("succeeded", None)
    at = retry_at(policy, claimed.attempt, claimed.event_created_at, now, jitter)
    return Next("failed", None) if at is None else Next("pending", at)


async def claim(session: AsyncSession, now: datetime, lease_s: float, limit: int) -> list[Claimed]:
    """Up to `limit` due deliveries to enabled endpoints, oldest due first, claimed for
    `lease_s`."""
    rows = (await session.execute(
        select(WebhookDelivery, WebhookEndpoint, WebhookEvent)
        .join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
        .join(WebhookEvent, WebhookEvent.id == WebhookDelivery.event_id)
        .where(WebhookDelivery.status == "pending", WebhookDelivery.next_attempt_at <= now,
               WebhookEndpoint.enabled.is_(True))       # a disabled endpoint's wait
        .order_by(WebhookDelivery.next_attempt_at).limit(limit)
        .with_for_update(of=WebhookDelivery, skip_locked=True))).tuples().all()
    claimed = []
    for delivery, endpoint, event in rows:
        delivery.attempts += 1
        delivery.claim_id = str(uuid.uuid4())
        delivery.next_attempt_at = now + timedelta(seconds=lease_s)
        claimed.append(Claimed(
            delivery.id, delivery.claim_id, delivery.attempts, event.id, event.type,
            event.created_at, event_body(event.id, event.type, event.tenant_id, event.created_at,
                                         event.payload),
            endpoint.url, endpoint.id, endpoint.secret_sealed, endpoint.operator))
    return claimed


async def record(session: AsyncSession, claimed: Claimed, attempt: Attempt, then: Next,
                 now: datetime) -> bool:
    """The attempt and what follows it; False (nothing written) when the claim was lost."""
    delivery = await session.scalar(
        select(WebhookDelivery).where(WebhookDelivery.id == claimed.delivery_id,
                                      WebhookDelivery.claim_id == claimed.claim_id)
        .with_for_update())
    if delivery is None:
        return False
    error = None if attempt.error is None else attempt.error[:MAX_ERROR]
    session.add(WebhookAttempt(delivery_id=delivery.id, number=claimed.attempt,
                               started_at=attempt.started_at, duration_ms=attempt.duration_ms,
                               status_code=attempt.status_code, error=error))
    delivery.claim_id = None
    delivery.status, delivery.next_attempt_at = then.status, then.at
    delivery.last_status_code, delivery.last_error = attempt.status_code, error
    delivery.completed_at = None if then.status == "pending" else now
    return True


@dataclass(frozen=True)
class DeliveryView:
    delivery: WebhookDelivery
    event_type: str
    attempts: list[WebhookAttempt]


async def list_for_endpoint(session: AsyncSession, endpoint_id: str,
                            limit: int) -> list[DeliveryView]:
    """The endpoint's latest deliveries, newest first, each with its attempts in order."""
    rows = (await session.execute(
        select(WebhookDelivery, WebhookEvent.type)
        .join(WebhookEvent, WebhookEvent.id == WebhookDelivery.event_id)
        .where(WebhookDelivery.endpoint_id == endpoint_id)
        .order_by(WebhookDelivery.created_at.desc(), WebhookDelivery.id).limit(limit))).tuples().all()
    attempts: dict[str, list[WebhookAttempt]] = {d.id: [] for d, _ in rows}
    for attempt in await session.scalars(
            select(WebhookAttempt).where(WebhookAttempt.delivery_id.in_(list(attempts)))
            .order_by(WebhookAttempt.number)):
        attempts[attempt.delivery_id].append(attempt)
    return [DeliveryView(d, event_type, attempts[d.id]) for d, event_type in rows]
