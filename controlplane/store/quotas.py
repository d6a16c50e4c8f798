"""Tenant quotas: the admin's overrides over the settings default, and what a tenant
holds now (for the static checks of controlplane.quotas)."""
from __future__ import annotations

from typing import Any, Optional

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.store.tables import Deployment, QuotaOverride, Revision, Tenant, utcnow
from controlplane.quotas import LIMITS, Quota, TenantHoldings
from controlplane.store.errors import NotFound


async def lock_tenant(session: AsyncSession, tenant_id: str) -> Tenant:
    """The tenant's row, locked to the end of the transaction: every change a quota
    counts (deployments, their scaling, uploads) takes this lock first."""
    tenant = await session.scalar(select(Tenant).where(Tenant.id == tenant_id).with_for_update())
    if tenant is None:
        raise NotFound("tenant", tenant_id)
    return tenant


async def overrides_of(session: AsyncSession, tenant_id: str) -> dict[str, Any]:
    row = await session.get(QuotaOverride, tenant_id)
    return {name: getattr(row, name) if row else None for name in LIMITS}


async def quota_for(session: AsyncSession, tenant_id: str, default: Quota) -> Quota:
    return default.with_overrides(await overrides_of(session, tenant_id))


async def quotas_by_tenant(session: AsyncSession, default: Quota) -> dict[str, Quota]:
    """Every tenant with overrides; the others have `default`."""
    rows = await session.scalars(select(QuotaOverride))
    return {row.tenant_id: default.with_overrides({n: getattr(row, n) for n in LIMITS})
            for row in rows}


async def set_overrides(session: AsyncSession, tenant_id: str,
                        changes: dict[str, Any]) -> None:
    """Given limits replace the override; None resets one to the default."""
    values = {**changes, "updated_at": utcnow()}
    await session.execute(insert(QuotaOverride).values(tenant_id=tenant_id, **values)
                          .on_conflict_do_update(index_elements=[QuotaOverride.tenant_id],
                                                 set_=values))


async def holdings(session: AsyncSession, tenant_id: str,
                   excluding: Optional[str] = None) -> TenantHoldings:
    """Live deployments of the tenant (but `excluding`), and the GPUs their min_replicas
    keep held: each revision taking traffic keeps min_replicas replicas."""
    rows = (await session.execute(
        select(Deployment, Revision).join(Revision, Revision.deployment_id == Deployment.id)
        .where(Deployment.tenant_id == tenant_id, Deployment.deleted_at.is_(None)))).tuples()
    deployments: set[str] = set()
    reserved = 0
    for deployment, revision in rows:
        if deployment.id == excluding:
            continue
        deployments.add(deployment.id)
        if deployment.traffic.get(revision.name, 0) > 0:
            reserved += deployment.min_replicas * revision.gpu_count
    return TenantHoldings(deployments=len(deployments), reserved_gpus=reserved)
