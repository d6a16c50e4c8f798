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
from typing import Any, Protocol, Sequence

from controlplane.webhooks.events import BUDGET_THRESHOLD

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

    @property
    def dedupe_key(self) -> str:
        """One event per budget, period and kind, however many control planes see it."""
        return f"{BUDGET_THRESHOLD}:{self.budget_id}:{self.period_start.isoformat()}:{self.kind}"

    def payload(self) -> dict[str, Any]:
        """Its webhook event's data: money as decimal strings (JSON numbers lose digits),
        times in ISO 8601 UTC; the tenant is the event's own field."""
        return {"budget_id": self.budget_id, "scope": self.scope, "scope_id": self.scope_id,
                "period_start": self.period_start.isoformat(), "kind": self.kind,
                "limit": str(self.limit), "spent": str(self.spent), "at": self.at.isoformat()}


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
