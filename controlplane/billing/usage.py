"""One usage event per invocation, as plain data that survives a JSON round trip."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from datetime import datetime
from decimal import Decimal
from typing import Any, Optional


@dataclass(frozen=True)
class UsageRecord:
    invocation_id: str
    request_id: str
    tenant_id: str
    api_key_id: Optional[str]
    deployment_id: str
    deployment_name: str
    revision_id: str
    revision_name: str
    model: str
    endpoint: str
    status: str                  # ok | partial | error
    http_status: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    queue_s: Optional[float]
    cold_start_s: Optional[float]
    ttft_s: Optional[float]
    total_s: float
    cost: Decimal
    replica_id: Optional[str]
    started_at: datetime
    finished_at: datetime
    # A function call's (None for a model's): the items it carried, and its share of the
    # GPU time of the batches that computed them (batch seconds x GPUs / batch items).
    items: Optional[int] = None
    gpu_seconds: Optional[float] = None
    # Billed at a later start from the call journal: the call was cut by the control
    # plane's own death (controlplane.billing.call_journal).
    recovered: bool = False
    # The adapter the call ran with (its id and name at the call); None: the base model.
    adapter_id: Optional[str] = None
    adapter_name: Optional[str] = None
    adapter_load_s: Optional[float] = None     # its wait for the adapter's load into a warm replica

    def not_billable(self) -> Optional[str]:
        """Why no row may hold this record, or None: Postgres stores a NaN cost or time
        as it is, and one NaN makes every sum it is in NaN."""
        if not self.cost.is_finite():
            return f"cost is {self.cost}"
        for name in FLOAT_FIELDS:
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                return f"{name} is {value}"
        return None

    def row(self) -> dict[str, Any]:
        """A shallow dict: dataclasses.asdict deep-copies every field, too slow for the write path."""
        return {name: getattr(self, name) for name in FIELD_NAMES}

    def to_json(self) -> str:
        row = self.row()
        row["cost"] = str(self.cost)
        row["started_at"] = self.started_at.isoformat()
        row["finished_at"] = self.finished_at.isoformat()
        return json.dumps(row, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> "UsageRecord":
        row = json.loads(line)
        unknown = set(row) - set(FIELD_NAMES)
        if unknown:
            raise ValueError(f"usage record: unknown fields {sorted(unknown)}")
        row["cost"] = Decimal(row["cost"])
        row["started_at"] = datetime.fromisoformat(row["started_at"])
        row["finished_at"] = datetime.fromisoformat(row["finished_at"])
        return cls(**row)


FIELD_NAMES = tuple(f.name for f in fields(UsageRecord))
FLOAT_FIELDS = ("queue_s", "cold_start_s", "ttft_s", "total_s", "gpu_seconds", "adapter_load_s")
