"""Usage records for tests and the benchmark."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from decimal import Decimal

from controlplane.billing.usage import UsageRecord

TENANT = "00000000-0000-0000-0000-0000000000aa"


def make_record(*, tenant_id: str = TENANT, started_at: datetime | None = None,
                prompt_tokens: int = 10, completion_tokens: int = 5, cached_tokens: int = 0,
                cost: Decimal = Decimal("0.000015"), deployment_name: str = "chat",
                revision_name: str = "r1", model: str = "s3://m/llama/", status: str = "ok",
                api_key_id: str | None = None, items: int | None = None,
                gpu_seconds: float | None = None,
                deployment_id: str = "00000000-0000-0000-0000-0000000000bb",
                replica_id: str = "rep-0", adapter_id: str | None = None,
                adapter_name: str | None = None) -> UsageRecord:
    """A model's call (with `adapter_id` and `adapter_name`, an adapter's); with `items`
    (and `gpu_seconds`), a function's."""
    started_at = started_at or datetime.now(timezone.utc)
    return UsageRecord(
        invocation_id=str(uuid.uuid4()), request_id=uuid.uuid4().hex, tenant_id=tenant_id,
        api_key_id=api_key_id, deployment_id=deployment_id,
        deployment_name=deployment_name,
        revision_id="00000000-0000-0000-0000-0000000000cc", revision_name=revision_name,
        model=model, endpoint="chat/completions" if items is None else "functions/invoke",
        status=status, http_status=200,
        prompt_tokens=prompt_tokens, cached_tokens=cached_tokens,
        completion_tokens=completion_tokens, queue_s=0.001, cold_start_s=None, ttft_s=0.01,
        total_s=0.05, cost=cost, replica_id=replica_id, started_at=started_at,
        finished_at=started_at + timedelta(milliseconds=50), items=items, gpu_seconds=gpu_seconds,
        adapter_id=adapter_id, adapter_name=adapter_name)
