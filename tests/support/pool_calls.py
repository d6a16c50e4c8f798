"""What the pool's tests share: a revision spec over a model in S3, and one completion
through a lease."""
from __future__ import annotations

import uuid

from pool.api import RevisionSpec
from tests.support.replica_client import replica_http
from spec.engine_options import ChosenOptions

PROMPT = "The quick brown fox"
IDLE_TIMEOUT_S = 600.0        # passed by SteppedClock.advance, never by waiting


def spec_for(uri: str, **changes) -> RevisionSpec:
    base = dict(revision_id=f"rev-{uuid.uuid4().hex[:8]}", deployment_id="dep-1", tenant_id="ten-1",
                model_uri=uri, gpu_memory_gb=0.25, gpu_count=1, min_replicas=0, max_replicas=1,
                target_concurrency=4, idle_timeout_s=IDLE_TIMEOUT_S,
                engine=ChosenOptions({"kv_cache_tokens": 512}))
    base.update(changes)
    return RevisionSpec(**base)


async def complete(lease, **extra) -> dict:
    body = {"model": lease.revision_id, "prompt": PROMPT, "max_tokens": 8, "temperature": 0.0, **extra}
    async with replica_http(timeout=60, headers=lease.headers) as client:
        resp = await client.post(f"{lease.base_url}/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()
