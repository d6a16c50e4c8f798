"""Budget threshold crossings (controlplane.budgets) as signed webhooks: the budgets'
alert sink that logs each crossing and publishes it as `budget.threshold` to the
tenant's endpoints and the operator's, once per budget, period and kind however many
control planes see it (the event's dedupe key)."""
from __future__ import annotations

from controlplane.budgets.alerts import BudgetAlert, LoggingAlertSink
from controlplane.webhooks.events import BUDGET_THRESHOLD, BudgetThreshold
from controlplane.webhooks.publisher import WebhookPublisher


class WebhookAlertSink:
    def __init__(self, publisher: WebhookPublisher):
        self.publisher = publisher
        self.log = LoggingAlertSink()

    async def crossed(self, alert: BudgetAlert) -> None:
        """Logged, then enqueued (a durable event and its deliveries; the worker sends)."""
        await self.log.crossed(alert)
        event = threshold_event(alert)
        await self.publisher.publish(alert.tenant_id, BUDGET_THRESHOLD, event.payload(), event.dedupe_key)


def threshold_event(alert: BudgetAlert) -> BudgetThreshold:
    return BudgetThreshold(alert.budget_id, alert.scope, alert.scope_id, alert.period_start,
                           alert.kind, alert.limit, alert.spent, alert.at)
