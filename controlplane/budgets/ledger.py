"""Budgets in Postgres: reserve at admission, settle when the usage row is written,
release a call that never reached its replica, expire what a killed control plane left.

Every figure a budget is judged by lives in its period row (budget_periods): `spent`,
the billed cost of the calls settled there, and `reserved`, the worst case of the calls
admitted and not yet settled. Admission locks the period rows of every budget that
applies (the tenant's, the key's, the deployment's) and checks spent + reserved + the
call's worst case against each limit before it adds its reservation, all in one
transaction: control planes sharing the database queue on those row locks, so no two
calls both take the last of a budget.

Spend comes only from usage rows: the statement that inserts a batch of them
(controlplane.billing.metering) deletes the reservations of the rows it really inserted
(ON CONFLICT DO NOTHING leaves a replayed row out), and `settle` adds their billed cost
to the period each reservation was made in, in the same transaction. A row written twice,
or a call recovered from the call journal after its reservation expired, is therefore
counted once. A paid row of a budgeted tenant that had no reservation (served while
Postgres was away, admitted before the budget existed) counts in the budgets that apply
to it, in the period of its start. Period rows are locked in (budget, period start) order everywhere, so the
writers, the gateway and the sweeper never deadlock on them.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Optional, Sequence

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from controlplane.budgets.alerts import BudgetAlert, BudgetAlertSink, hand_over
from controlplane.budgets.periods import Period, period_of
from controlplane.budgets.policy import (Standing, Threshold, crossings, limit_reached, refusal, retry_after_s,
                                         soft_threshold)

log = logging.getLogger("thawpool.budgets")
Row = Any          # an asyncpg Record
EXPIRE_BATCH = 1000

BUDGETS_OF_CALL = """
SELECT id, scope, scope_id, limit_amount, period, time_zone FROM budgets
WHERE tenant_id = $1 AND ((scope = 'tenant' AND scope_id = $1) OR (scope = 'key' AND scope_id = $2)
                          OR (scope = 'deployment' AND scope_id = $3))"""
OPEN_PERIODS = """
INSERT INTO budget_periods (budget_id, period_start, period_end)
SELECT * FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[]) ON CONFLICT DO NOTHING"""
LOCK_PERIODS = """
SELECT p.budget_id, p.period_start, p.spent, p.reserved FROM budget_periods p
JOIN unnest($1::uuid[], $2::timestamptz[]) AS k(budget_id, period_start)
  ON p.budget_id = k.budget_id AND p.period_start = k.period_start
ORDER BY p.budget_id, p.period_start FOR UPDATE OF p"""
HOLD = """
WITH held AS (
  UPDATE budget_periods p SET reserved = p.reserved + $4
  FROM unnest($2::uuid[], $3::timestamptz[]) AS k(budget_id, period_start)
  WHERE p.budget_id = k.budget_id AND p.period_start = k.period_start)
INSERT INTO budget_reservations (invocation_id, budget_id, period_start, amount, expires_at)
SELECT $1, k.budget_id, k.period_start, $4, $5
FROM unnest($2::uuid[], $3::timestamptz[]) AS k(budget_id, period_start)"""
APPLY = """
UPDATE budget_periods p SET spent = p.spent + k.cost, reserved = greatest(p.reserved - k.held, 0)
FROM unnest($1::uuid[], $2::timestamptz[], $3::numeric[], $4::numeric[]) AS k(budget_id, period_start, cost, held)
WHERE p.budget_id = k.budget_id AND p.period_start = k.period_start
RETURNING p.budget_id, p.period_start, p.spent"""
UNRESERVE = """
DELETE FROM budget_reservations WHERE invocation_id = $1
RETURNING budget_id, period_start, amount, expired, 0::numeric AS cost"""
EXPIRE = """
WITH due AS (
  SELECT invocation_id, budget_id FROM budget_reservations
  WHERE NOT expired AND expires_at <= $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)
UPDATE budget_reservations r SET expired = true FROM due
WHERE r.invocation_id = due.invocation_id AND r.budget_id = due.budget_id
RETURNING r.budget_id, r.period_start, r.amount, false AS expired, 0::numeric AS cost"""
FORGET = "DELETE FROM budget_reservations WHERE expired AND expires_at <= $1"
BUDGETS_OF_TENANTS = """
SELECT id, tenant_id, scope, scope_id, period, time_zone FROM budgets WHERE tenant_id = ANY($1::uuid[])"""
THRESHOLDS = """
SELECT id, tenant_id, scope, scope_id, limit_amount, soft_fraction, soft_amount FROM budgets
WHERE id = ANY($1::uuid[])"""
RECORD_ALERTS = """
INSERT INTO budget_alerts (id, budget_id, tenant_id, scope, scope_id, period_start, kind, limit_amount,
                           spent, created_at)
SELECT gen_random_uuid(), * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::uuid[], $5::timestamptz[],
                                        $6::text[], $7::numeric[], $8::numeric[], $9::timestamptz[])
ON CONFLICT (budget_id, period_start, kind) DO NOTHING
RETURNING budget_id, tenant_id, scope, scope_id, period_start, kind, limit_amount, spent, created_at"""


@dataclass(frozen=True)
class Charge:
    """A call about to be admitted: whose, where, and its worst-case cost."""
    invocation_id: str
    tenant_id: str
    key_id: Optional[str]
    deployment_id: str
    amount: Decimal
    at: datetime


@dataclass(frozen=True)
class Hold:
    """What admission reserved for a call: against how many budgets (0: none applied)."""
    invocation_id: str
    budgets: int = 0


class BudgetExceeded(Exception):
    """The call would overrun `standing`'s budget."""

    def __init__(self, standing: Standing, amount: Decimal, retry_after_s: Optional[float]):
        super().__init__(f"{standing.scope} budget {standing.budget_id} exceeded")
        self.standing = standing
        self.amount = amount
        self.retry_after_s = retry_after_s


class Ledger:
    def __init__(self, db_engine: AsyncEngine, sink: BudgetAlertSink, *, reservation_ttl_s: float,
                 retention_s: float):
        self.db_engine = db_engine
        self.sink = sink
        self.reservation_ttl_s = reservation_ttl_s
        self.retention_s = retention_s

    async def reserve(self, charge: Charge) -> Hold:
        """The call's worst case held against every budget that applies; BudgetExceeded
        naming the first that has no room (nothing is held then)."""
        async with self.db_engine.connect() as sa_conn:
            conn = await driver(sa_conn)
            budgets = await conn.fetch(BUDGETS_OF_CALL, charge.tenant_id, charge.key_id, charge.deployment_id)
            if not budgets:
                return Hold(charge.invocation_id)
            periods = {str(b["id"]): period_of(b["period"], b["time_zone"], charge.at) for b in budgets}
            async with conn.transaction():
                standings = await _standings(conn, budgets, periods)
                refused = refusal(standings, charge.amount)
                if refused is None:
                    ids = sorted(periods)
                    await conn.execute(HOLD, charge.invocation_id, ids, [periods[i].start for i in ids],
                                       charge.amount, charge.at + timedelta(seconds=self.reservation_ttl_s))
                    return Hold(charge.invocation_id, len(ids))
            if limit_reached(refused, charge.amount):     # not only calls in flight: a hard alert
                await self._alert(conn, [(refused, "hard")], charge)
        assert refused is not None
        raise BudgetExceeded(refused, charge.amount, retry_after_s(refused, charge.amount, charge.at))

    async def _alert(self, conn: Row, crossed: list[tuple[Standing, str]], charge: Charge) -> None:
        thresholds = await conn.fetch(THRESHOLDS, [s.budget_id for s, _ in crossed])
        owners = {str(t["id"]): t for t in thresholds}
        alerts = await _record(conn, [(owners[s.budget_id], s.period_start, kind, s.spent)
                                      for s, kind in crossed if s.budget_id in owners], charge.at)
        await hand_over(self.sink, alerts)

    async def release(self, hold: Hold) -> None:
        """A call that never reached its replica gives its reservations back."""
        if not hold.budgets:
            return
        async with self.db_engine.connect() as sa_conn:
            conn = await driver(sa_conn)
            async with conn.transaction():
                await apply(conn, await conn.fetch(UNRESERVE, hold.invocation_id))

    async def expire(self, now: datetime) -> int:
        """Reservations past their deadline stop holding money back (their call's control
        plane died before metering it, or the call outlived the deadline); the long
        expired are forgotten. How many expired now."""
        async with self.db_engine.connect() as sa_conn:
            conn = await driver(sa_conn)
            async with conn.transaction():
                due = await conn.fetch(EXPIRE, now, EXPIRE_BATCH)
                await apply(conn, due)
            await conn.execute(FORGET, now - timedelta(seconds=self.retention_s))
        if due:
            log.warning("budget reservations expired unsettled", extra={"reservations": len(due)})
        return len(due)


async def driver(sa_conn: AsyncConnection) -> Row:
    """The asyncpg connection under SQLAlchemy's: one round trip per statement."""
    return (await sa_conn.get_raw_connection()).driver_connection


async def _standings(conn: Row, budgets: Sequence[Row], periods: dict[str, Period]) -> list[Standing]:
    """Each budget's current period row, created if new and locked (in budget order)."""
    ids = sorted(periods)
    starts = [periods[i].start for i in ids]
    await conn.execute(OPEN_PERIODS, ids, starts, [periods[i].end for i in ids])
    locked = {str(row["budget_id"]): row for row in await conn.fetch(LOCK_PERIODS, ids, starts)}
    return [Standing(str(b["id"]), b["scope"], str(b["scope_id"]), b["limit_amount"],
                     locked[str(b["id"])]["spent"], locked[str(b["id"])]["reserved"], b["period"],
                     periods[str(b["id"])].start, periods[str(b["id"])].end) for b in budgets]


async def settle(conn: Row, settled: Sequence[Row], now: datetime) -> list[BudgetAlert]:
    """Inside the usage rows' transaction: each deleted reservation's call cost added to
    its period, its hold taken off, and each unreserved row's cost to the periods of the
    budgets that apply to it; the thresholds this spend crossed, recorded (and returned,
    for the sink once the transaction commits)."""
    if not settled:
        return []
    reserved = [row for row in settled if row["budget_id"] is not None]
    unreserved = [row for row in settled if row["budget_id"] is None]
    spent = await apply(conn, reserved + await _unreserved(conn, unreserved))
    thresholds = {str(t["id"]): t for t in await conn.fetch(THRESHOLDS, sorted({str(r["budget_id"]) for r in spent}))}
    crossed = []
    for row in spent:
        budget = thresholds.get(str(row["budget_id"]))
        if budget is None:
            continue
        limit = budget["limit_amount"]
        threshold = Threshold(limit, soft_threshold(limit, budget["soft_fraction"], budget["soft_amount"]))
        crossed += [(budget, row["period_start"], kind, row["spent"]) for kind in crossings(threshold, row["spent"])]
    return await _record(conn, crossed, now)


async def _unreserved(conn: Row, rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Usage rows that held no reservation, as entries for `apply` (nothing held) in the
    periods of the budgets that apply to them, those period rows opened (in order)."""
    if not rows:
        return []
    budgets = await conn.fetch(BUDGETS_OF_TENANTS, sorted({str(r["tenant_id"]) for r in rows}))
    entries, periods = [], {}
    for row in rows:
        for budget in budgets:
            if applies(budget, row):
                period = period_of(budget["period"], budget["time_zone"], row["started_at"])
                periods[(str(budget["id"]), period.start)] = period.end
                entries.append({"budget_id": budget["id"], "period_start": period.start,
                                "amount": Decimal(0), "expired": True, "cost": row["cost"]})
    keys = sorted(periods)
    if keys:
        await conn.execute(OPEN_PERIODS, [k[0] for k in keys], [k[1] for k in keys], [periods[k] for k in keys])
    return entries


def applies(budget: Row, row: Row) -> bool:
    """Whether a usage row (tenant, key, deployment) counts in the budget."""
    scope_of_row = {"tenant": row["tenant_id"], "key": row["api_key_id"], "deployment": row["deployment_id"]}
    return bool(budget["tenant_id"] == row["tenant_id"] and budget["scope_id"] == scope_of_row[budget["scope"]])


async def apply(conn: Row, rows: Sequence[Row]) -> list[Row]:
    """Reservation rows (budget, period, amount, expired, cost) into their periods: cost
    added to spend, the amount of a live one taken off what is reserved; period rows
    locked in order first."""
    totals: dict[tuple[str, datetime], list[Decimal]] = defaultdict(lambda: [Decimal(0), Decimal(0)])
    for row in rows:
        total = totals[(str(row["budget_id"]), row["period_start"])]
        total[0] += row["cost"]
        total[1] += Decimal(0) if row["expired"] else row["amount"]
    if not totals:
        return []
    keys = sorted(totals)
    ids, starts = [k[0] for k in keys], [k[1] for k in keys]
    await conn.fetch(LOCK_PERIODS, ids, starts)
    return list(await conn.fetch(APPLY, ids, starts, [totals[k][0] for k in keys], [totals[k][1] for k in keys]))


async def _record(conn: Row, crossed: Sequence[tuple[Row, datetime, str, Decimal]],
                  now: datetime) -> list[BudgetAlert]:
    """Alerts not yet recorded for their budget, period and kind: inserted, and returned."""
    if not crossed:
        return []
    columns: list[list[Any]] = [[str(b["id"]) for b, *_ in crossed], [str(b["tenant_id"]) for b, *_ in crossed],
                                [b["scope"] for b, *_ in crossed], [str(b["scope_id"]) for b, *_ in crossed],
                                [start for _, start, _, _ in crossed], [kind for _, _, kind, _ in crossed],
                                [b["limit_amount"] for b, *_ in crossed], [spent for *_, spent in crossed],
                                [now] * len(crossed)]
    rows = await conn.fetch(RECORD_ALERTS, *columns)
    return [BudgetAlert(str(r["tenant_id"]), str(r["budget_id"]), r["scope"], str(r["scope_id"]),
                        r["period_start"], r["kind"], r["limit_amount"], r["spent"], r["created_at"])
            for r in rows]
