"""Budget threshold crossings (controlplane.budgets) as signed webhooks: the budgets'
alert sink that logs each crossing and publishes it as `budget.threshold` to the
tenant's endpoints and the operator's, once per budget, period and kind however many
control planes see it (the alert's dedupe key)."""
from __future__ import annotations

from controlplane.budgets.alerts import BudgetAlert, LoggingAlertSink
from controlplane.webhooks.events import BUDGET_THRESHOLD
from controlplane.webhooks.publisher import WebhookPublisher


class WebhookAlertSink:
    def __init__(self, publisher: WebhookPublisher):
        self.publisher = publisher
        self.log = LoggingAlertSink()

    async def crossed(self, alert: BudgetAlert) -> None:
        """Logged, then enqueued (a durable event and its deliveries; the worker sends)."""
        await self.log.crossed(alert)
        await self.publisher.publish(alert.tenant_id, BUDGET_THRESHOLD, alert.payload(), alert.dedupe_key)
