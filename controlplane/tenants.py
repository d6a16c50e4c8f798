"""Tenants and their API keys in Postgres: create, look up, revoke."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Optional

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.errors import ApiError
from controlplane.keys import NewKey, generate_key, hash_key
from controlplane.models import ApiKey, Tenant, utcnow

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
        raise ApiError(409, f"tenant {name!r} already exists", code="tenant_exists")
    return tenant


async def find_tenant(session: AsyncSession, name_or_id: str) -> Tenant:
    tenant = await session.scalar(select(Tenant).where(Tenant.name == name_or_id))
    if tenant is None and _looks_like_uuid(name_or_id):
        tenant = await session.get(Tenant, name_or_id)
    if tenant is None:
        raise ApiError(404, f"tenant {name_or_id!r} not found", code="tenant_not_found")
    return tenant


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


async def revoke_key(session: AsyncSession, prefix: str,
                     tenant_id: Optional[str] = None) -> ApiKey:
    query = select(ApiKey).where(ApiKey.prefix == prefix)
    if tenant_id is not None:
        query = query.where(ApiKey.tenant_id == tenant_id)
    key = await session.scalar(query)
    if key is None:
        raise ApiError(404, f"key {prefix!r} not found", code="key_not_found")
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
        select(ApiKey.id).where(ApiKey.scopes.any("admin"), ApiKey.revoked_at.is_(None)))
    if live_admin is not None:
        return None
    tenant = await session.scalar(select(Tenant).where(Tenant.name == ADMIN_TENANT))
    if tenant is None:
        tenant = await create_tenant(session, ADMIN_TENANT)
    _, new = await create_key(session, tenant, ["admin", "billing:read", "deploy", "invoke"],
                              name="bootstrap admin")
    return new


def key_view(key: ApiKey) -> dict:
    return {"id": key.id, "prefix": key.prefix, "tenant_id": key.tenant_id,
            "scopes": list(key.scopes), "name": key.name,
            "requests_per_min": key.requests_per_min, "tokens_per_min": key.tokens_per_min,
            "expires_at": key.expires_at.isoformat() if key.expires_at else None,
            "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
            "created_at": key.created_at.isoformat()}


def _looks_like_uuid(value: str) -> bool:
    import uuid

    try:
        uuid.UUID(value)
        return True
    except ValueError:
        return False
