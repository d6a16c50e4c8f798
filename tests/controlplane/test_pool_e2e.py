"""The gateway over the real PoolManager: deploy, cold start a runtime replica, bill it.

The pool reads the desired state from Postgres (PostgresDesiredState) and records
replica lifetimes through PostgresReplicaEvents, as under `thawpool up`.
"""
import time

import openai
import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.store.tables import ReplicaLifetime, UsageEvent
from tests.controlplane.conftest import pooled_control_plane
from tests.support.waiting import eventually

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(300)]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    async with pooled_control_plane(db_url, s3_server, tmp_path_factory.mktemp("cp-pool")) as plane:
        yield plane


async def test_deploy_invoke_and_bill_through_the_pool(plane, model_uri):
    key = await plane.tenant_key("pooled")
    client = plane.client(key)
    never = await client.post("/v1/deployments", json={
        "name": "huge", "model_uri": model_uri, "resources": {"gpu_memory_gb": 4096}})
    assert never.status_code == 422 and never.json()["error"]["param"] == "resources"
    created = await client.post("/v1/deployments", json={
        "name": "pooled", "model_uri": model_uri, "resources": {"gpu_memory_gb": 0.5},
        "engine": {"kv_cache_tokens": 512}})
    assert created.status_code == 201, created.text
    revision_id = created.json()["revisions"][0]["id"]

    openai_client = openai.AsyncOpenAI(base_url=f"{plane.base_url}/v1", api_key=key,
                                       max_retries=0, timeout=280)
    started = time.monotonic()
    try:
        stream = await openai_client.chat.completions.create(
            model="pooled", messages=[{"role": "user", "content": "Hello"}], max_tokens=6,
            stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True}, extra_headers={"x-request-id": "pooled-1"})
        usage = None
        async for chunk in stream:
            usage = chunk.usage or usage
        assert usage.completion_tokens == 6
        waited_s = time.monotonic() - started
    finally:
        await openai_client.close()

    await plane.flush_usage()
    async with plane.app.state.sessions() as session:
        row = await session.scalar(select(UsageEvent).where(UsageEvent.request_id == "pooled-1"))
    assert row.status == "ok" and row.revision_id == revision_id
    assert row.cold_start_s is not None and 0 < row.cold_start_s <= waited_s, \
        "this request waited for a thaw, inside the time it took"
    assert row.replica_id and row.replica_id != "None"
    status = (await client.get("/v1/deployments/pooled")).json()["status"]
    assert status["r1"]["state"] == "ready"
    async def ready_lifetime():               # replica events reach Postgres asynchronously
        async with plane.app.state.sessions() as session:
            lifetime = await session.scalar(select(ReplicaLifetime).where(
                ReplicaLifetime.replica_id == row.replica_id))
        return lifetime if lifetime is not None and lifetime.ready_at is not None else None

    lifetime = await eventually(ready_lifetime, timeout_s=10,
                                what="the replica's lifetime row with its ready time")
    assert lifetime.revision_id == revision_id and lifetime.ready_at >= lifetime.started_at
