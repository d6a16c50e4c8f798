"""A tenant's LoRA adapters, always scoped by tenant: another tenant's adapter is simply
not found, whoever's base it is attached to (a shared base shows its owner none of the
adapters other tenants attach to it).

An adapter keeps what its attach read and checked (rank, targets, size) and the ETag and
size of its two objects (`pinned_objects`), which every load holds the bytes to, as a
revision does its model's. Deleting one marks it deleted; its name is free again.
"""
from __future__ import annotations

from typing import Optional

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.deploy.deployment_spec import NAME
from controlplane.store import deployments, names
from controlplane.store.errors import AlreadyExists, NotFound
from controlplane.store.tables import Adapter, Deployment, utcnow
from pool.api import Pins

# an adapter and the deployment it is attached to (its base)
Attached = tuple[Adapter, Deployment]


async def create(session: AsyncSession, adapter: Adapter) -> Adapter:
    """`adapter` stored, its name checked free among the tenant's live deployments and
    adapters (the caller holds the tenant's lock: controlplane.store.names)."""
    await names.check_free(session, adapter.tenant_id, adapter.name, "adapter")
    session.add(adapter)
    try:
        await session.flush()
    except IntegrityError:
        raise AlreadyExists("adapter", adapter.name) from None
    return adapter


def pinned(pins: Pins) -> dict[str, dict[str, object]]:
    """The objects an attach read, as the `pinned_objects` column keeps them."""
    return {uri: {"etag": p.etag, "size": p.size} for uri, p in pins.items()}


async def find(session: AsyncSession, tenant_id: str, name: str,
               for_update: bool = False) -> Attached:
    """The tenant's live adapter of that name and its base; NotFound for any other name."""
    if not NAME.match(name):
        raise NotFound("adapter", name)
    query = (select(Adapter, Deployment).join(Deployment, Adapter.deployment_id == Deployment.id)
             .where(Adapter.tenant_id == tenant_id, Adapter.name == name, Adapter.deleted_at.is_(None)))
    if for_update:
        query = query.with_for_update(of=Adapter)
    found = (await session.execute(query)).first()
    if found is None:
        raise NotFound("adapter", name)
    return found.tuple()


async def list_for(session: AsyncSession, tenant_id: str) -> list[Attached]:
    rows = await session.execute(
        select(Adapter, Deployment).join(Deployment, Adapter.deployment_id == Deployment.id)
        .where(Adapter.tenant_id == tenant_id, Adapter.deleted_at.is_(None)).order_by(Adapter.name))
    return [row.tuple() for row in rows]


async def delete(session: AsyncSession, tenant_id: str, name: str) -> Attached:
    """Marks it deleted; returns it and its base."""
    adapter, base = await find(session, tenant_id, name, for_update=True)
    adapter.deleted_at = utcnow()
    await session.flush()
    return adapter, base


async def delete_on(session: AsyncSession, deployment_id: str) -> list[str]:
    """Marks deleted every live adapter attached to the deployment, whoever's it is (its
    base is going away); returns their ids."""
    rows = list(await session.scalars(select(Adapter).where(
        Adapter.deployment_id == deployment_id, Adapter.deleted_at.is_(None)).with_for_update()))
    for adapter in rows:
        adapter.deleted_at = utcnow()
    await session.flush()
    return [a.id for a in rows]


async def find_base(session: AsyncSession, tenant_id: str, name: str) -> Optional[Deployment]:
    """The deployment `name` names as a base for this tenant: its own live deployment of
    that name, else the live shared one (the operator's catalogue); None when neither."""
    try:
        return await deployments.find(session, tenant_id, name)
    except NotFound:
        return await deployments.find_shared(session, name)
