"""Model-source grants: an admin lets one tenant, or every tenant, deploy from a prefix."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sqlalchemy import or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.fields import is_uuid
from controlplane.deploy.model_sources import own_prefix
from controlplane.store.tables import ModelSource, Tenant, new_id
from controlplane.sealing import Sealer
from controlplane.store.errors import AlreadyExists, NotFound
from pool.api import S3Access
from pool.s3 import longest_prefix


@dataclass(frozen=True)
class Source:
    prefix: str
    kind: str            # own | shared (every tenant) | granted (this tenant)


@dataclass(frozen=True)
class Grant:
    row: ModelSource
    tenant_name: Optional[str]       # None: every tenant


async def grant(session: AsyncSession, prefix: str, tenant: Optional[Tenant],
                access: Optional[S3Access] = None, sealer: Optional[Sealer] = None) -> Grant:
    """`access`: the bucket is the tenant's own, read with these credentials (the
    secret sealed by `sealer`, bound to this row)."""
    row = ModelSource(id=new_id(), prefix=prefix, tenant_id=tenant.id if tenant else None)
    if access is not None:
        assert sealer is not None and tenant is not None, "own credentials are one tenant's"
        row.endpoint_url, row.region = access.endpoint_url, access.region
        row.access_key_id = access.access_key_id
        row.secret_sealed = sealer.seal(access.secret_access_key, row.id)
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
    return [Source(own_prefix(models_bucket, tenant.id), "own"), *granted]


async def access_for_tenant(session: AsyncSession, tenant_id: str, uri: str,
                            sealer: Sealer) -> Optional[S3Access]:
    """The credentials of the tenant's own grant that `uri` lies under (the longest
    prefix); None: the platform's credentials read it."""
    rows = (await session.execute(select(ModelSource).where(
        ModelSource.tenant_id == tenant_id, ModelSource.secret_sealed.is_not(None)))).scalars()
    grants = {row.prefix: row for row in rows}
    prefix = longest_prefix(uri, grants)
    if prefix is None:
        return None
    row = grants[prefix]
    assert row.access_key_id is not None and row.secret_sealed is not None
    return S3Access(row.access_key_id, sealer.open(row.secret_sealed, row.id),
                    endpoint_url=row.endpoint_url, region=row.region)
