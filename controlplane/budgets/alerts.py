"""A budget's threshold crossing and the seam it is handed to.

Each crossing is recorded once per budget, period and kind (table budget_alerts) and then
handed to a `BudgetAlertSink`. The default sink logs it; a publisher of signed webhooks
plugs in here. `crossed` is awaited by the code that found the crossing (the usage writer
after its transaction, or the gateway refusing a call), so a sink must hand the alert off
(a queue, a task) rather than deliver it inline; an exception it raises is logged and
dropped (the alert stays recorded).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Protocol, Sequence

log = logging.getLogger("thawpool.budgets")


@dataclass(frozen=True)
class BudgetAlert:
    tenant_id: str
    budget_id: str
    scope: str                      # tenant | key | deployment
    scope_id: str
    period_start: datetime
    kind: str                       # soft | hard
    limit: Decimal
    spent: Decimal
    at: datetime


class BudgetAlertSink(Protocol):
    async def crossed(self, alert: BudgetAlert) -> None: ...


class LoggingAlertSink:
    """The default: one warning line per crossing."""

    async def crossed(self, alert: BudgetAlert) -> None:
        log.warning("budget %s threshold crossed", alert.kind, extra={
            "alert": "budget_" + alert.kind, "tenant_id": alert.tenant_id, "budget_id": alert.budget_id,
            "scope": alert.scope, "scope_id": alert.scope_id, "limit": str(alert.limit),
            "spent": str(alert.spent), "period_start": alert.period_start.isoformat()})


async def hand_over(sink: BudgetAlertSink, alerts: Sequence[BudgetAlert]) -> None:
    """Each alert to the sink; a sink that fails loses none of the others."""
    for alert in alerts:
        try:
            await sink.crossed(alert)
        except Exception:  # noqa: BLE001 - the alert is recorded; delivery is the sink's
            log.exception("budget alert sink failed", extra={"budget_id": alert.budget_id})
