"""Budgets as tenants and operators manage them: set (create or replace), list, find,
delete, and each one's standing in its current period. The money held and spent is the
ledger's (controlplane.budgets.ledger); a budget set mid-period starts from the billed
usage of its scope since the period began, so it judges the period's real spend."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Optional

from sqlalchemy import ColumnElement, delete, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.budgets.periods import Period, period_of
from controlplane.budgets.spec import BudgetSpec
from controlplane.fields import is_uuid
from controlplane.store import deployments
from controlplane.store.errors import NotFound
from controlplane.store.tables import (ApiKey, Budget, BudgetAlertRow, BudgetPeriod, Deployment, Tenant,
                                       UsageEvent, new_id)


@dataclass(frozen=True)
class BudgetStanding:
    budget: Budget
    period: Period
    spent: Decimal
    reserved: Decimal
    alerts: list[BudgetAlertRow]
    scope_name: Optional[str]       # the tenant's or deployment's name, the key's prefix

    @property
    def remaining(self) -> Decimal:
        return max(Decimal(0), self.budget.limit_amount - self.spent - self.reserved)


async def scope_id(session: AsyncSession, tenant_id: str, spec: BudgetSpec) -> str:
    """The id of what the budget is on: the tenant, its key (by id or prefix) or its live
    deployment (by name); another tenant's is not found."""
    if spec.scope == "tenant":
        return tenant_id
    assert spec.target is not None          # spec.parse_budget requires it
    if spec.scope == "deployment":
        return (await deployments.find(session, tenant_id, spec.target)).id
    match = ApiKey.id == spec.target if is_uuid(spec.target) else ApiKey.prefix == spec.target
    key = await session.scalar(select(ApiKey).where(match, ApiKey.tenant_id == tenant_id))
    if key is None:
        raise NotFound("key", spec.target)
    return key.id


async def set_budget(session: AsyncSession, tenant_id: str, spec: BudgetSpec, target_id: str,
                     now: datetime) -> tuple[Budget, bool]:
    """The budget on `target_id`, created or replaced (and whether it is new); its current
    period opened from the scope's billed usage when it has none yet."""
    values = dict(limit_amount=spec.limit, period=spec.period, time_zone=spec.time_zone,
                  soft_fraction=spec.soft_fraction, soft_amount=spec.soft_amount, updated_at=now)
    row = (await session.execute(
        insert(Budget).values(id=new_id(), tenant_id=tenant_id, scope=spec.scope, scope_id=target_id,
                              created_at=now, **values)
        .on_conflict_do_update(constraint="uq_budgets_scope", set_=values)
        .returning(Budget.id, Budget.created_at))).one()
    budget = await session.get(Budget, row.id, populate_existing=True)
    assert budget is not None
    period = period_of(budget.period, budget.time_zone, now)
    spent = await billed(session, budget, period, now)
    await session.execute(insert(BudgetPeriod).values(
        budget_id=budget.id, period_start=period.start, period_end=period.end, spent=spent,
        reserved=Decimal(0)).on_conflict_do_nothing())
    return budget, row.created_at == now


async def billed(session: AsyncSession, budget: Budget, period: Period, now: datetime) -> Decimal:
    """The usage rows of the budget's scope that started in the period, up to now."""
    query = select(func.coalesce(func.sum(UsageEvent.cost), 0)).where(
        UsageEvent.tenant_id == budget.tenant_id, UsageEvent.started_at >= period.start,
        UsageEvent.started_at < (period.end or now), _scope_filter(budget))
    return Decimal(await session.scalar(query) or 0)


def _scope_filter(budget: Budget) -> ColumnElement[bool]:
    if budget.scope == "key":
        return UsageEvent.api_key_id == budget.scope_id
    if budget.scope == "deployment":
        return UsageEvent.deployment_id == budget.scope_id
    return UsageEvent.tenant_id == budget.scope_id


async def budgeted_tenants(session: AsyncSession) -> set[str]:
    """Every tenant with a budget (the others' calls need no budget read)."""
    return set(await session.scalars(select(Budget.tenant_id).distinct()))


async def has_budgets(session: AsyncSession, tenant_id: str) -> bool:
    return await session.scalar(select(Budget.id).where(Budget.tenant_id == tenant_id).limit(1)) is not None


async def list_budgets(session: AsyncSession, tenant_id: Optional[str]) -> list[Budget]:
    """A tenant's budgets (None: every tenant's), broadest scope first."""
    query = select(Budget).order_by(Budget.tenant_id, Budget.scope.desc(), Budget.created_at)
    if tenant_id is not None:
        query = query.where(Budget.tenant_id == tenant_id)
    return list(await session.scalars(query))


async def find_budget(session: AsyncSession, budget_id: str, tenant_id: Optional[str]) -> Budget:
    """The budget by id; another tenant's (unless `tenant_id` is None: an admin) is not found."""
    budget = await session.get(Budget, budget_id) if is_uuid(budget_id) else None
    if budget is None or tenant_id not in (None, budget.tenant_id):
        raise NotFound("budget", budget_id)
    return budget


async def delete_budget(session: AsyncSession, budget: Budget) -> None:
    """The budget, its periods, reservations and alerts (a call in flight settles nowhere)."""
    await session.execute(delete(Budget).where(Budget.id == budget.id))


async def standing(session: AsyncSession, budget: Budget, now: datetime) -> BudgetStanding:
    """Spent, reserved and the alerts of the budget's period holding `now`."""
    period = period_of(budget.period, budget.time_zone, now)
    row = await session.get(BudgetPeriod, (budget.id, period.start))
    alerts = list(await session.scalars(select(BudgetAlertRow).where(
        BudgetAlertRow.budget_id == budget.id, BudgetAlertRow.period_start == period.start)
        .order_by(BudgetAlertRow.created_at)))
    name = await _scope_name(session, budget)
    if row is None:
        return BudgetStanding(budget, period, Decimal(0), Decimal(0), alerts, name)
    return BudgetStanding(budget, period, row.spent, row.reserved, alerts, name)


async def _scope_name(session: AsyncSession, budget: Budget) -> Optional[str]:
    column = {"tenant": (Tenant.name, Tenant.id), "key": (ApiKey.prefix, ApiKey.id),
              "deployment": (Deployment.name, Deployment.id)}[budget.scope]
    name: Optional[str] = await session.scalar(select(column[0]).where(column[1] == budget.scope_id))
    return name


def view(entry: BudgetStanding) -> dict[str, Any]:
    budget, period = entry.budget, entry.period
    return {
        "id": budget.id, "tenant_id": budget.tenant_id, "scope": budget.scope, "scope_id": budget.scope_id,
        "scope_name": entry.scope_name,
        "limit": money(budget.limit_amount), "period": budget.period, "time_zone": budget.time_zone,
        "soft_fraction": None if budget.soft_fraction is None else money(budget.soft_fraction),
        "soft_amount": None if budget.soft_amount is None else money(budget.soft_amount),
        "spent": money(entry.spent), "reserved": money(entry.reserved), "remaining": money(entry.remaining),
        "current_period": {"start": period.start.isoformat(),
                           "end": None if period.end is None else period.end.isoformat()},
        "alerts": [{"kind": a.kind, "spent": money(a.spent), "limit": money(a.limit_amount),
                    "at": a.created_at.isoformat()} for a in entry.alerts],
        "created_at": budget.created_at.isoformat(), "updated_at": budget.updated_at.isoformat()}


def money(amount: Decimal) -> str:
    """Plain decimal notation without trailing zeros: "12.5", "0", never "0E-15"."""
    text = f"{amount.normalize():f}"
    return "0" if text == "-0" else text
