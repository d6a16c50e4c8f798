"""The event types webhooks deliver, and the body every delivery POSTs.

An endpoint subscribes to types by name, or to `*` (every type, present and future).
`webhook.test` goes only to the endpoint a test ping names, whatever it subscribes to.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Optional

BUDGET_THRESHOLD = "budget.threshold"
TEST = "webhook.test"
EVENT_TYPES = frozenset({BUDGET_THRESHOLD, TEST})
EVERY_TYPE = "*"


def event_body(event_id: str, event_type: str, tenant_id: Optional[str], created_at: datetime,
               payload: dict[str, Any]) -> bytes:
    """The JSON a delivery POSTs (and signs): the same bytes on every attempt."""
    return json.dumps({"id": event_id, "type": event_type, "created_at": created_at.isoformat(),
                       "tenant_id": tenant_id, "data": payload},
                      sort_keys=True, separators=(",", ":")).encode()
