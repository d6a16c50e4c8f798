"""Tenants and their API keys: create, look up, list, revoke; the caller behind a key."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Optional

from sqlalchemy import any_, literal, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.deploy.deployment_spec import NAME
from controlplane.fields import is_uuid
from controlplane.auth.keys import KEY_PREFIX_SHAPE, NewKey, generate_key
from controlplane.auth.priorities import KeyPriorities
from controlplane.store.tables import ApiKey, Tenant, utcnow
from controlplane.store.errors import AlreadyExists, InvalidField, NotFound

ADMIN_TENANT = "system"          # the operator's tenant: the only one whose keys may be admin
KEY_ATTEMPTS = 5                 # new secrets tried when a visible prefix is taken


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
    priorities: KeyPriorities = KeyPriorities()

    @property
    def is_admin(self) -> bool:
        """The admin scope counts on the operator's tenant only (create_key refuses it
        elsewhere; this holds even for a row written some other way)."""
        return "admin" in self.scopes and self.tenant_name == ADMIN_TENANT


async def create_tenant(session: AsyncSession, name: str) -> Tenant:
    tenant = Tenant(name=name)
    try:
        async with session.begin_nested():
            session.add(tenant)
    except IntegrityError:
        raise AlreadyExists("tenant", name) from None
    return tenant


async def find_tenant(session: AsyncSession, name_or_id: str) -> Tenant:
    tenant = await session.scalar(select(Tenant).where(Tenant.name == name_or_id)) \
        if NAME.match(name_or_id) else None
    if tenant is None and is_uuid(name_or_id):
        tenant = await session.get(Tenant, name_or_id)
    if tenant is None:
        raise NotFound("tenant", name_or_id)
    return tenant


async def list_tenants(session: AsyncSession) -> list[Tenant]:
    return list(await session.scalars(select(Tenant).order_by(Tenant.name)))


async def create_key(session: AsyncSession, tenant: Tenant, scopes: list[str], *,
                     name: Optional[str] = None, expires_at: Optional[datetime] = None,
                     requests_per_min: Optional[int] = None,
                     tokens_per_min: Optional[int] = None,
                     priorities: Optional[KeyPriorities] = None) -> tuple[ApiKey, NewKey]:
    """A new key; its visible prefix is short, so a taken one means another secret.
    `priorities` (None: the platform's defaults) is checked first (InvalidField)."""
    priorities = priorities or KeyPriorities()
    priorities.check()
    if "admin" in scopes and tenant.name != ADMIN_TENANT:
        raise InvalidField("scopes", f"the admin scope exists only on the operator's tenant "
                                     f"{ADMIN_TENANT!r}")
    for _ in range(KEY_ATTEMPTS):
        new = generate_key()
        key = ApiKey(tenant_id=tenant.id, prefix=new.prefix, key_hash=new.key_hash,
                     scopes=scopes, name=name, expires_at=expires_at,
                     requests_per_min=requests_per_min, tokens_per_min=tokens_per_min,
                     priority_min=priorities.priority_min, priority_max=priorities.priority_max,
                     priority_default=priorities.priority_default)
        try:
            async with session.begin_nested():
                session.add(key)
        except IntegrityError:
            continue
        return key, new
    raise RuntimeError(f"no free key prefix in {KEY_ATTEMPTS} attempts")


def key_priorities(key: ApiKey) -> KeyPriorities:
    return KeyPriorities(key.priority_min, key.priority_max, key.priority_default)


async def list_keys(session: AsyncSession, tenant_id: str) -> list[ApiKey]:
    return list(await session.scalars(select(ApiKey).where(ApiKey.tenant_id == tenant_id)
                                      .order_by(ApiKey.created_at)))


async def revoke_key(session: AsyncSession, prefix: str,
                     tenant_id: Optional[str] = None) -> ApiKey:
    """Revoked from now on (again: unchanged); `tenant_id` given, another tenant's key is
    not found."""
    key = await session.scalar(select(ApiKey).where(ApiKey.prefix == prefix)) \
        if KEY_PREFIX_SHAPE.match(prefix) else None
    if key is None or tenant_id not in (None, key.tenant_id):
        raise NotFound("key", prefix)
    if key.revoked_at is None:
        key.revoked_at = utcnow()
    return key


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

