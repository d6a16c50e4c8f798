"""Publishing: an event and one delivery per matching endpoint, written in one
transaction, once per dedupe key.

Several control planes may see the same occurrence (a budget crossing its threshold);
each publishes it with the same `dedupe_key` and the unique index keeps the first, so
its endpoints get one delivery each. An endpoint matches when it is enabled, subscribes
to the type (or to `*`), and is the event's tenant's (its own or the operator's for that
tenant) or the operator's for every event. A platform event (no tenant) reaches only
the last kind. Delivery itself is the worker's (controlplane.webhooks.worker).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional

from sqlalchemy import ColumnElement, and_, any_, func, insert, literal, or_, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.fields import storable_json, text
from controlplane.store.tables import (WebhookDelivery, WebhookEndpoint, WebhookEvent, new_id,
                                       utcnow)
from controlplane.webhooks.events import EVENT_TYPES, EVERY_TYPE, TEST


@dataclass(frozen=True)
class Published:
    event_id: str
    new: bool                # False: the dedupe key was published before; nothing added
    deliveries: int


def new_event_id() -> str:
    return f"evt_{uuid.uuid4().hex}"


class WebhookPublisher:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]):
        self.sessions = sessions

    async def publish(self, tenant_id: Optional[str], event_type: str, payload: dict[str, Any],
                      dedupe_key: str) -> Published:
        """In a transaction of its own; `publish_in` joins the caller's (so an alert is
        written with the state change that caused it, or not at all)."""
        async with self.sessions.begin() as session:
            return await publish_in(session, tenant_id, event_type, payload, dedupe_key)

    async def ping(self, endpoint: WebhookEndpoint) -> tuple[Published, str]:
        """A `webhook.test` event to this endpoint alone; its delivery id."""
        async with self.sessions.begin() as session:
            event_id, created = new_event_id(), utcnow()
            session.add(WebhookEvent(id=event_id, tenant_id=endpoint.tenant_id, type=TEST,
                                     payload={"endpoint_id": endpoint.id}, created_at=created,
                                     dedupe_key=f"{TEST}:{uuid.uuid4().hex}"))
            await session.flush()            # the event before its delivery (no relationship)
            delivery = WebhookDelivery(id=new_id(), event_id=event_id, endpoint_id=endpoint.id,
                                       status="pending", attempts=0, next_attempt_at=created,
                                       created_at=created)
            session.add(delivery)
        return Published(event_id, True, 1), delivery.id


async def publish_in(session: AsyncSession, tenant_id: Optional[str], event_type: str,
                     payload: dict[str, Any], dedupe_key: str) -> Published:
    if event_type not in EVENT_TYPES:      # a caller's bug: endpoints subscribe by these names
        raise ValueError(f"unknown webhook event type {event_type!r}: add it to "
                         f"controlplane.webhooks.events")
    text("dedupe_key", dedupe_key, 500)
    storable_json("payload", payload)
    event_id, now = new_event_id(), utcnow()
    inserted = await session.scalar(
        pg_insert(WebhookEvent).values(id=event_id, tenant_id=tenant_id, type=event_type,
                                       payload=payload, dedupe_key=dedupe_key, created_at=now)
        .on_conflict_do_nothing(index_elements=["dedupe_key"]).returning(WebhookEvent.id))
    if inserted is None:
        existing = await session.scalar(
            select(WebhookEvent.id).where(WebhookEvent.dedupe_key == dedupe_key))
        return Published(str(existing), False, 0)
    return Published(event_id, True, await _fan_out(session, event_id, tenant_id, event_type, now))


async def _fan_out(session: AsyncSession, event_id: str, tenant_id: Optional[str],
                   event_type: str, now: datetime) -> int:
    """One pending delivery, due now, per matching endpoint."""
    matching = select(func.gen_random_uuid(), literal(event_id), WebhookEndpoint.id,
                      literal("pending"), literal(0), literal(now), literal(now)).where(
        WebhookEndpoint.enabled.is_(True),
        or_(literal(event_type) == any_(WebhookEndpoint.event_types),
            literal(EVERY_TYPE) == any_(WebhookEndpoint.event_types)),
        _reaches(tenant_id))
    result = await session.execute(insert(WebhookDelivery).from_select(
        ["id", "event_id", "endpoint_id", "status", "attempts", "next_attempt_at", "created_at"],
        matching).returning(WebhookDelivery.id))
    return len(result.all())


def _reaches(tenant_id: Optional[str]) -> ColumnElement[bool]:
    every_event = and_(WebhookEndpoint.operator.is_(True), WebhookEndpoint.tenant_id.is_(None))
    if tenant_id is None:
        return every_event
    return or_(every_event, WebhookEndpoint.tenant_id == tenant_id)
