"""Tenants and their API keys: create, look up, list, revoke; the caller behind a key."""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Optional

from sqlalchemy import any_, literal, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.keys import NewKey, generate_key, hash_key
from controlplane.models import ApiKey, Tenant, utcnow
from controlplane.store.errors import AlreadyExists, NotFound

ADMIN_TENANT = "system"


@dataclass(frozen=True)
class Principal:
    """Who is calling: one API key of one tenant."""
    key_id: str
    key_prefix: str
    tenant_id: str
    tenant_name: str
    scopes: frozenset[str]
    requests_per_min: Optional[int]
    tokens_per_min: Optional[int]

    @property
    def is_admin(self) -> bool:
        return "admin" in self.scopes


async def create_tenant(session: AsyncSession, name: str) -> Tenant:
    tenant = Tenant(name=name)
    session.add(tenant)
    try:
        await session.flush()
    except IntegrityError:
        raise AlreadyExists("tenant", name) from None
    return tenant


async def find_tenant(session: AsyncSession, name_or_id: str) -> Tenant:
    tenant = await session.scalar(select(Tenant).where(Tenant.name == name_or_id))
    if tenant is None and _looks_like_uuid(name_or_id):
        tenant = await session.get(Tenant, name_or_id)
    if tenant is None:
        raise NotFound("tenant", name_or_id)
    return tenant


async def list_tenants(session: AsyncSession) -> list[Tenant]:
    return list(await session.scalars(select(Tenant).order_by(Tenant.name)))


async def create_key(session: AsyncSession, tenant: Tenant, scopes: list[str], *,
                     name: Optional[str] = None, expires_at: Optional[datetime] = None,
                     requests_per_min: Optional[int] = None,
                     tokens_per_min: Optional[int] = None) -> tuple[ApiKey, NewKey]:
    new = generate_key()
    key = ApiKey(tenant_id=tenant.id, prefix=new.prefix, key_hash=new.key_hash,
                 scopes=scopes, name=name, expires_at=expires_at,
                 requests_per_min=requests_per_min, tokens_per_min=tokens_per_min)
    session.add(key)
    await session.flush()
    return key, new


async def list_keys(session: AsyncSession, tenant: Tenant) -> list[ApiKey]:
    return list(await session.scalars(select(ApiKey).where(ApiKey.tenant_id == tenant.id)
                                      .order_by(ApiKey.created_at)))


async def revoke_key(session: AsyncSession, prefix: str) -> ApiKey:
    key = await session.scalar(select(ApiKey).where(ApiKey.prefix == prefix))
    if key is None:
        raise NotFound("key", prefix)
    if key.revoked_at is None:
        key.revoked_at = utcnow()
    return key


async def principal_for(session: AsyncSession, secret: str) -> Optional[Principal]:
    """The live key behind a bearer secret, or None (unknown, revoked or expired)."""
    row = (await session.execute(
        select(ApiKey, Tenant.name).join(Tenant, Tenant.id == ApiKey.tenant_id)
        .where(ApiKey.key_hash == hash_key(secret)))).first()
    if row is None:
        return None
    key, tenant_name = row
    if key.revoked_at is not None or (key.expires_at and key.expires_at <= utcnow()):
        return None
    return Principal(key_id=key.id, key_prefix=key.prefix, tenant_id=key.tenant_id,
                     tenant_name=tenant_name, scopes=frozenset(key.scopes),
                     requests_per_min=key.requests_per_min, tokens_per_min=key.tokens_per_min)


async def bootstrap_admin(session: AsyncSession) -> Optional[NewKey]:
    """On first start, an admin key in the system tenant; None when one exists."""
    live_admin = await session.scalar(
        select(ApiKey.id).where(literal("admin") == any_(ApiKey.scopes),
                                ApiKey.revoked_at.is_(None)))
    if live_admin is not None:
        return None
    tenant = await session.scalar(select(Tenant).where(Tenant.name == ADMIN_TENANT))
    if tenant is None:
        tenant = await create_tenant(session, ADMIN_TENANT)
    _, new = await create_key(session, tenant, ["admin", "billing:read", "deploy", "invoke"],
                              name="bootstrap admin")
    return new


def _looks_like_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
        return True
    except ValueError:
        return False
