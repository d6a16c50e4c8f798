"""The operator's price book: rows by scope (default, tenant plan, deployment override,
adapter), each in effect from its `effective_from` on.

An adapter's row belongs to the adapter's owner and names its base deployment too. A
base's override applies to every caller of that base, whoever owns it: the catalogue
price of a `shared` base is the operator's, and any tenant may call it. A plan applies
to its own tenant only.

The past is fixed: a row takes effect now or later, never earlier, and only a
row not yet in effect can be deleted, so no change of the book reprices usage
that has happened. The default row is seeded from the settings at the first
start (`seed_default`); after that the book, not the settings, holds it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Optional

from sqlalchemy import and_, or_, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.store.tables import Adapter, Deployment, Price, Tenant, new_id
from controlplane.billing.pricing import INTERACTIVE, PriceRow, PriceScope, Pricing
from controlplane.store.book_rows import withdraw_scheduled
from controlplane.store.errors import AlreadyExists

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class BookRow:
    """A price row with the names it applies to."""
    row: Price
    tenant_name: Optional[str] = None
    deployment_name: Optional[str] = None
    adapter_name: Optional[str] = None

    @property
    def price(self) -> PriceRow:
        return price_row(self.row)


def pricing_of(row: Price) -> Pricing:
    return Pricing(row.input_per_mtok, row.cached_input_per_mtok, row.output_per_mtok,
                   row.gpu_second, row.per_call)


def price_row(row: Price) -> PriceRow:
    scope = (PriceScope.ADAPTER if row.adapter_id else
             PriceScope.DEPLOYMENT if row.deployment_id else
             PriceScope.TENANT if row.tenant_id else PriceScope.DEFAULT)
    return PriceRow(scope, row.effective_from, pricing_of(row))


async def seed_default(session: AsyncSession, pricing: Pricing) -> None:
    """The settings' price as the default from the epoch on, when the book has none (two
    control planes starting at once both insert the same row; one wins)."""
    has_default = await session.scalar(select(Price.id).where(
        Price.tenant_id.is_(None), Price.deployment_id.is_(None), Price.tier == INTERACTIVE).limit(1))
    if has_default is None:
        await session.execute(insert(Price).values(
            id=new_id(), effective_from=EPOCH, created_at=datetime.now(timezone.utc),
            **asdict(pricing)).on_conflict_do_nothing())


async def add(session: AsyncSession, pricing: Pricing, effective_from: datetime,
              tenant: Optional[Tenant] = None, deployment: Optional[Deployment] = None,
              adapter: Optional[tuple[Adapter, Deployment]] = None,
              tier: str = INTERACTIVE) -> BookRow:
    """With an adapter (the tenant's, and its base), the row names the adapter's base as
    its deployment; `tier` (pricing.TIERS): which calls it prices."""
    if adapter is not None:
        deployment = adapter[1]
    row = Price(tenant_id=tenant.id if tenant else None, deployment_id=deployment.id if deployment else None,
                adapter_id=adapter[0].id if adapter else None,
                tier=tier, effective_from=effective_from, **asdict(pricing))
    try:
        async with session.begin_nested():
            session.add(row)
    except IntegrityError:
        raise AlreadyExists(f"{tier} price", f"effective from {effective_from.isoformat()}") from None
    return BookRow(row, tenant.name if tenant else None, deployment.name if deployment else None,
                   adapter[0].name if adapter else None)


async def book(session: AsyncSession, tenant: Optional[Tenant] = None) -> list[BookRow]:
    """Every row (or a tenant's plan, overrides and adapters' rows), by scope and time."""
    query = (select(Price, Tenant.name, Deployment.name, Adapter.name)
             .outerjoin(Tenant, Tenant.id == Price.tenant_id)
             .outerjoin(Deployment, Deployment.id == Price.deployment_id)
             .outerjoin(Adapter, Adapter.id == Price.adapter_id)
             .order_by(Tenant.name.nulls_first(), Deployment.name.nulls_first(),
                       Adapter.name.nulls_first(), Price.effective_from))
    if tenant is not None:
        query = query.where(Price.tenant_id == tenant.id)
    return [BookRow(*row) for row in (await session.execute(query)).tuples()]


async def delete_scheduled(session: AsyncSession, price_id: str, now: datetime) -> None:
    await withdraw_scheduled(session, Price, price_id, now, noun="price", code="price_in_effect")


async def rows_for_tenant(session: AsyncSession, tenant_id: str) -> list[Price]:
    """The rows that can price the tenant's calls: the default rows, its plan, its
    deployments' overrides, its adapters' rows and the shared bases' overrides."""
    shared = select(Deployment.id).where(Deployment.shared)
    return list(await session.scalars(select(Price).where(
        or_(Price.tenant_id.is_(None), Price.tenant_id == tenant_id,
            and_(Price.adapter_id.is_(None), Price.deployment_id.in_(shared))))
        .order_by(Price.effective_from)))


def applicable(rows: list[Price], deployment_id: str,
               adapter_id: Optional[str] = None, tier: str = INTERACTIVE) -> list[PriceRow]:
    """Of the rows that can price a caller (the default, its plan, overrides), those of
    `tier` that price a call of `deployment_id`, with `adapter_id` or the base model (None)."""
    return [price_row(r) for r in rows
            if r.deployment_id in (None, deployment_id) and r.tier == tier
            and (r.adapter_id is None or r.adapter_id == adapter_id)]
