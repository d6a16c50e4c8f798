"""The event types webhooks deliver, and the body every delivery POSTs.

An endpoint subscribes to types by name, or to `*` (every type, present and future).
`webhook.test` goes only to the endpoint a test ping names, whatever it subscribes to.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Optional

BUDGET_THRESHOLD = "budget.threshold"
TEST = "webhook.test"
EVENT_TYPES = frozenset({BUDGET_THRESHOLD, TEST})
EVERY_TYPE = "*"


@dataclass(frozen=True)
class BudgetThreshold:
    """A budget crossed its soft threshold or its hard limit in one period (published by
    the budgets, once per budget, period and kind: see `dedupe_key`)."""
    budget_id: str
    scope: str                  # tenant | key | deployment
    scope_id: str
    period_start: datetime
    kind: str                   # soft | hard
    limit: Decimal
    spent: Decimal
    at: datetime

    @property
    def dedupe_key(self) -> str:
        return f"{BUDGET_THRESHOLD}:{self.budget_id}:{self.period_start.isoformat()}:{self.kind}"

    def payload(self) -> dict[str, Any]:
        """Money as decimal strings (JSON numbers lose digits), times in ISO 8601 UTC."""
        return {"budget_id": self.budget_id, "scope": self.scope, "scope_id": self.scope_id,
                "period_start": self.period_start.isoformat(), "kind": self.kind,
                "limit": str(self.limit), "spent": str(self.spent), "at": self.at.isoformat()}


def event_body(event_id: str, event_type: str, tenant_id: Optional[str], created_at: datetime,
               payload: dict[str, Any]) -> bytes:
    """The JSON a delivery POSTs (and signs): the same bytes on every attempt."""
    return json.dumps({"id": event_id, "type": event_type, "created_at": created_at.isoformat(),
                       "tenant_id": tenant_id, "data": payload},
                      sort_keys=True, separators=(",", ":")).encode()
