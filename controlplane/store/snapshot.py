"""What the control plane keeps in memory for the hot path, read from Postgres: API keys
with their tenant, live deployments with their revisions, live adapters, quota
overrides and the price book. Whole (`load_all`) or one changed row at a time."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Optional

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.store import deployments
from controlplane.store.tables import Adapter, ApiKey, Deployment, Price, QuotaOverride, Revision, Tenant
from controlplane.quotas import LIMITS
from controlplane.store.tenants import Principal, key_priorities

Deployed = tuple[Deployment, list[Revision]]
Overrides = dict[str, Any]   # a limit (int) or a grant (list of "host:port")


@dataclass(frozen=True)
class KeyEntry:
    """One API key as the hot path needs it; a revoked or expired key stays known, so it
    is refused from memory."""
    key_id: str
    key_hash: str
    principal: Principal
    revoked: bool
    expires_at: Optional[datetime]

    def principal_at(self, now: datetime) -> Optional[Principal]:
        if self.revoked or (self.expires_at is not None and self.expires_at <= now):
            return None
        return self.principal


@dataclass(frozen=True)
class CacheSnapshot:
    keys: list[KeyEntry]
    deployments: list[Deployed]
    quotas: dict[str, Overrides]          # tenant id -> the admin's overrides
    prices: list[Price]
    adapters: list[Adapter] = field(default_factory=list)


async def load_all(session: AsyncSession) -> CacheSnapshot:
    return CacheSnapshot(await _keys(session), await _deployments(session),
                         await load_quotas(session), await load_prices(session), await _adapters(session))


async def load_key(session: AsyncSession, *, key_id: Optional[str] = None,
                   key_hash: Optional[str] = None) -> Optional[KeyEntry]:
    found = await _keys(session, key_id=key_id, key_hash=key_hash)
    return found[0] if found else None


async def load_deployment(session: AsyncSession, deployment_id: str) -> Optional[Deployed]:
    """The deployment with its revisions, or None once it is deleted."""
    found = await _deployments(session, deployment_id)
    return found[0] if found else None


async def load_adapter(session: AsyncSession, adapter_id: str) -> Optional[Adapter]:
    """The adapter, or None once it is deleted."""
    found = await _adapters(session, Adapter.id == adapter_id)
    return found[0] if found else None


async def find_shared(session: AsyncSession, name: str) -> Optional[Deployed]:
    """A live shared (catalogue) deployment by name, with its revisions."""
    deployment = await deployments.find_shared(session, name)
    return None if deployment is None else await load_deployment(session, deployment.id)


async def shared_deployments(session: AsyncSession) -> list[Deployed]:
    ids = await session.scalars(select(Deployment.id).where(Deployment.shared.is_(True),
                                                            Deployment.deleted_at.is_(None)))
    return [d for i in ids if (d := await load_deployment(session, i)) is not None]


async def _adapters(session: AsyncSession, *where: Any) -> list[Adapter]:
    query = select(Adapter).where(Adapter.deleted_at.is_(None), *where).order_by(Adapter.created_at)
    return list(await session.scalars(query))


async def load_quotas(session: AsyncSession, tenant_id: Optional[str] = None) -> dict[str, Overrides]:
    query = select(QuotaOverride)
    if tenant_id is not None:
        query = query.where(QuotaOverride.tenant_id == tenant_id)
    return {row.tenant_id: {name: getattr(row, name) for name in LIMITS}
            for row in await session.scalars(query)}


async def load_prices(session: AsyncSession) -> list[Price]:
    return list(await session.scalars(select(Price).order_by(Price.effective_from)))


async def _keys(session: AsyncSession, *, key_id: Optional[str] = None,
                key_hash: Optional[str] = None) -> list[KeyEntry]:
    query = select(ApiKey, Tenant.name).join(Tenant, Tenant.id == ApiKey.tenant_id)
    if key_id is not None:
        query = query.where(ApiKey.id == key_id)
    if key_hash is not None:
        query = query.where(ApiKey.key_hash == key_hash)
    return [_entry(key, tenant_name) for key, tenant_name in (await session.execute(query)).tuples()]


def _entry(key: ApiKey, tenant_name: str) -> KeyEntry:
    principal = Principal(key_id=key.id, key_prefix=key.prefix, tenant_id=key.tenant_id,
                          tenant_name=tenant_name, scopes=frozenset(key.scopes),
                          requests_per_min=key.requests_per_min,
                          tokens_per_min=key.tokens_per_min, priorities=key_priorities(key))
    return KeyEntry(key.id, key.key_hash, principal, key.revoked_at is not None, key.expires_at)


async def _deployments(session: AsyncSession, deployment_id: Optional[str] = None) -> list[Deployed]:
    query = (select(Deployment, Revision).join(Revision, Revision.deployment_id == Deployment.id)
             .where(Deployment.deleted_at.is_(None)).order_by(Revision.number))
    if deployment_id is not None:
        query = query.where(Deployment.id == deployment_id)
    by_id: dict[str, Deployed] = {}
    for deployment, revision in (await session.execute(query)).tuples():
        by_id.setdefault(deployment.id, (deployment, []))[1].append(revision)
    return list(by_id.values())
