"""One namespace per tenant for what a call's `model` names by itself: a deployment, or
an adapter (DESIGN.md: `model` is a deployment name, `deployment:adapter`, or the
adapter's own name). No live deployment and live adapter of a tenant share a name, so
a name alone always says which one it is.

Each table's unique index keeps its own names apart; across the two, each create asks
here first, under the tenant's lock (`quotas.lock_tenant`), which both creates take, so
two creates of one name cannot pass together.
"""
from __future__ import annotations

from typing import Literal, Optional

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.store.errors import AlreadyExists, Conflict
from controlplane.store.tables import Adapter, Deployment

Kind = Literal["deployment", "adapter"]


async def holder_of(session: AsyncSession, tenant_id: str, name: str) -> Optional[Kind]:
    """What of the tenant's live deployments and adapters is called `name`, if any."""
    if await session.scalar(select(Deployment.id).where(
            Deployment.tenant_id == tenant_id, Deployment.name == name,
            Deployment.deleted_at.is_(None))) is not None:
        return "deployment"
    if await session.scalar(select(Adapter.id).where(
            Adapter.tenant_id == tenant_id, Adapter.name == name,
            Adapter.deleted_at.is_(None))) is not None:
        return "adapter"
    return None


async def check_free(session: AsyncSession, tenant_id: str, name: str, kind: Kind) -> None:
    """AlreadyExists (409) when a `kind` of that name lives; Conflict (409, name_taken)
    when the other kind holds it."""
    holder = await holder_of(session, tenant_id, name)
    if holder == kind:
        raise AlreadyExists(kind, name)
    if holder is not None:
        raise Conflict("name_taken", f"name: {name!r} is the name of your {holder}; a call's "
                                     "model names either one by its own name, so this "
                                     f"{kind} needs another")
