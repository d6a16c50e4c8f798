"""How long delivered events are kept: an event whose deliveries are all done (succeeded
or given up) is deleted, with its deliveries and their attempts, once it is older than
`settings.webhook_retention_s`; an event with a delivery still pending is kept until
that delivery ends."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, exists, select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.store.tables import WebhookDelivery, WebhookEvent

PRUNE_EVERY_S = 3600.0


async def prune(session: AsyncSession, before: datetime) -> int:
    """Deletes the done events created before `before`; how many."""
    pending = exists(select(WebhookDelivery.id).where(
        WebhookDelivery.event_id == WebhookEvent.id, WebhookDelivery.status == "pending"))
    result = await session.execute(delete(WebhookEvent).where(
        WebhookEvent.created_at < before, ~pending).returning(WebhookEvent.id))
    return len(result.all())
