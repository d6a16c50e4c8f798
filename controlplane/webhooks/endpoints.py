"""Webhook endpoints: register, list, get, delete; who sees which.

A disabled endpoint is matched by no new event and its pending deliveries wait (the
worker claims none of them) until it is enabled again.

A tenant registers endpoints for its own events and sees only those. The operator (an
admin key) registers endpoints for one tenant's events or, with no tenant, for every
event, tenants' and the platform's; a tenant never sees an operator's endpoint (another
tenant's or an operator's endpoint is simply not found). The secret that signs each
delivery is made here, returned once, and kept sealed (controlplane.sealing) bound to
the endpoint's id: the worker must sign with it again, so a one-way hash cannot do.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, Optional
from urllib.parse import urlsplit

from sqlalchemy import Select, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.fields import is_uuid, storable, text
from controlplane.sealing import Sealer
from controlplane.store.errors import InvalidField, NotFound, StaticQuotaExceeded
from controlplane.store.tables import WebhookEndpoint, new_id
from controlplane.webhooks.events import EVENT_TYPES, EVERY_TYPE, TEST

SECRET_PREFIX = "whsec_"
MAX_URL = 2000
MAX_EVENT_TYPES = 32
MAX_ENDPOINTS = 20          # per tenant's own, per operator target: each event fans out to them


@dataclass(frozen=True)
class Viewer:
    """Who asks: the operator sees every endpoint, a tenant only its own."""
    tenant_id: str
    is_operator: bool


@dataclass(frozen=True)
class EndpointSpec:
    """A checked registration; tenant_id None (the operator's only): every event."""
    url: str
    event_types: list[str]
    enabled: bool
    description: Optional[str]
    tenant_id: Optional[str]
    operator: bool


def check_url(value: Any) -> str:
    """An absolute http(s) URL with a host and no credentials in it."""
    url = text("url", value, MAX_URL)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidField("url", "must be an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise InvalidField("url", "must not carry credentials (the signature authenticates)")
    try:
        valid_port = parts.port != 0
    except ValueError:        # past 65535, or not a number
        valid_port = False
    if not valid_port:
        raise InvalidField("url", "has an invalid port")
    return url


def check_event_types(value: Any) -> list[str]:
    """Known type names, or ["*"] for every type; never empty."""
    if not isinstance(value, list) or not value or len(value) > MAX_EVENT_TYPES:
        raise InvalidField("event_types", f"a list of 1 to {MAX_EVENT_TYPES} event types")
    names = [storable("event_types", text("event_types", v, 100)) for v in value]
    known = EVENT_TYPES - {TEST}
    unknown = sorted(set(names) - known - {EVERY_TYPE})
    if unknown:
        raise InvalidField("event_types", f"unknown type {unknown[0]!r}; choose from "
                                          f"{sorted(known)} or {EVERY_TYPE!r}")
    return sorted(set(names))


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


async def create(session: AsyncSession, spec: EndpointSpec,
                 sealer: Sealer) -> tuple[WebhookEndpoint, str]:
    """The new endpoint and its secret (in clear this once)."""
    await _check_room(session, spec)
    secret = new_secret()
    row = WebhookEndpoint(id=new_id(), tenant_id=spec.tenant_id, operator=spec.operator,
                          url=spec.url, event_types=spec.event_types, enabled=spec.enabled,
                          description=spec.description)
    row.secret_sealed = sealer.seal(secret, row.id)
    session.add(row)
    await session.flush()
    return row, secret


async def _check_room(session: AsyncSession, spec: EndpointSpec) -> None:
    held = await session.scalar(select(func.count()).select_from(WebhookEndpoint).where(
        WebhookEndpoint.operator.is_(spec.operator),
        WebhookEndpoint.tenant_id == spec.tenant_id if spec.tenant_id is not None
        else WebhookEndpoint.tenant_id.is_(None)))
    if (held or 0) >= MAX_ENDPOINTS:
        raise StaticQuotaExceeded("webhooks", f"at most {MAX_ENDPOINTS} endpoints; delete one "
                                              "first")


def visible_to(viewer: Viewer) -> Select[WebhookEndpoint]:
    query = select(WebhookEndpoint)
    if not viewer.is_operator:
        query = query.where(WebhookEndpoint.tenant_id == viewer.tenant_id,
                            WebhookEndpoint.operator.is_(False))
    return query


async def list_for(session: AsyncSession, viewer: Viewer,
                   tenant_id: Optional[str] = None) -> list[WebhookEndpoint]:
    """What `viewer` sees; the operator may narrow it to one tenant's events."""
    query = visible_to(viewer).order_by(WebhookEndpoint.created_at, WebhookEndpoint.id)
    if tenant_id is not None:
        query = query.where(WebhookEndpoint.tenant_id == tenant_id)
    return list(await session.scalars(query))


async def get(session: AsyncSession, viewer: Viewer, endpoint_id: str) -> WebhookEndpoint:
    """The endpoint, if `viewer` may see it: NotFound for anyone else's."""
    row = (await session.scalar(visible_to(viewer).where(WebhookEndpoint.id == endpoint_id))
           if is_uuid(endpoint_id) else None)
    if row is None:
        raise NotFound("webhook", endpoint_id)
    return row


async def update(session: AsyncSession, viewer: Viewer, endpoint_id: str,
                 changes: dict[str, Any]) -> WebhookEndpoint:
    """Sets the checked `changes` (url, event_types, enabled, description); the secret and
    the owner never change."""
    row = await get(session, viewer, endpoint_id)
    for name, value in changes.items():
        setattr(row, name, value)
    return row


async def delete(session: AsyncSession, viewer: Viewer, endpoint_id: str) -> None:
    """Its pending deliveries go with it (nothing more is sent there)."""
    await session.delete(await get(session, viewer, endpoint_id))
