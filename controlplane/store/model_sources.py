"""Model-source grants: an admin lets one tenant, or every tenant, deploy from a prefix."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sqlalchemy import or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.fields import is_uuid
from controlplane.model_sources import own_prefix
from controlplane.models import ModelSource, Tenant
from controlplane.store.errors import AlreadyExists, NotFound


@dataclass(frozen=True)
class Source:
    prefix: str
    kind: str            # own | shared (every tenant) | granted (this tenant)


@dataclass(frozen=True)
class Grant:
    row: ModelSource
    tenant_name: Optional[str]       # None: every tenant


async def grant(session: AsyncSession, prefix: str, tenant: Optional[Tenant]) -> Grant:
    row = ModelSource(prefix=prefix, tenant_id=tenant.id if tenant else None)
    try:
        async with session.begin_nested():
            session.add(row)
    except IntegrityError:
        raise AlreadyExists("model source", prefix) from None
    return Grant(row, tenant.name if tenant else None)


async def list_grants(session: AsyncSession, tenant: Optional[Tenant] = None) -> list[Grant]:
    """Every grant, or those that reach `tenant` (its own and the shared ones)."""
    query = (select(ModelSource, Tenant.name).outerjoin(Tenant, Tenant.id == ModelSource.tenant_id)
             .order_by(ModelSource.prefix, ModelSource.created_at))
    if tenant is not None:
        query = query.where(or_(ModelSource.tenant_id == tenant.id,
                                ModelSource.tenant_id.is_(None)))
    return [Grant(row, name) for row, name in (await session.execute(query)).tuples()]


async def revoke(session: AsyncSession, grant_id: str) -> None:
    row = await session.get(ModelSource, grant_id) if is_uuid(grant_id) else None
    if row is None:
        raise NotFound("model source", grant_id)
    await session.delete(row)


async def sources_for(session: AsyncSession, tenant: Tenant, models_bucket: str) -> list[Source]:
    """The tenant's own prefix, then what admins granted every tenant or this one."""
    granted = [Source(g.row.prefix, "granted" if g.row.tenant_id else "shared")
               for g in await list_grants(session, tenant)]
    return [Source(own_prefix(models_bucket, tenant.name), "own"), *granted]

