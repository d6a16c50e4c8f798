"""Serverless end to end: control plane + pool manager + real runtime processes.

Deploy a tiny model from SeaweedFS S3, invoke it cold (a thaw happens and its
stages are recorded), invoke it warm, step the pool's clock past the idle timeout
(not before: the replica stays) and see zero replicas, invoke again for the same
greedy answer; kill the replica process
mid-stream and see a clean error, a `partial` usage row, and a fresh replica
for the next request.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.db import migrate_async
from controlplane.store.tables import UsageEvent
from tests.controlplane.conftest import (ControlPlane, cpu_pool_settings, create_database,
                                         drop_database, make_settings, real_pool,
                                         running_control_plane)
from tests.support.clock import SteppedClock
from tests.support.model_factory import upload_model
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(600)

# Passed by stepping the pool's clock (SteppedClock), never by waiting: a short real
# timeout would race the warm request on a slow machine.
IDLE_TIMEOUT_S = 600.0
BLOCK_SIZE = 16               # the runtime's default KV block
# Long enough to fill whole KV blocks, so a repeat of it is served from the prefix cache.
PROMPT = "Hello there! Please write a short poem about serverless GPU pools that thaw."
CHAT = {"model": "thaw", "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 12, "temperature": 0, "ignore_eos": True}


@pytest_asyncio.fixture(scope="module")
async def plane(pg_server, s3_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    db_url = await create_database(pg_server)
    await migrate_async(db_url)
    pool_settings = cpu_pool_settings(
        s3_server, tmp / "cache", warm_pool_size=1, desired_refresh_s=0.5,
        scale_down_delay_s=0.5, load_timeout_s=240)
    settings = make_settings(db_url, s3_server, tmp / "cp", acquire_timeout_s=280)
    try:
        async with running_control_plane(
                settings, pool_factory=real_pool(pool_settings, clock=SteppedClock()),
                catalogue="s3://e2e-models/tiny/") as plane:
            yield plane
    finally:
        await drop_database(pg_server, db_url)


@pytest.fixture(scope="module")
def model_uri(tiny_model, s3_server):
    s3_server.ensure_bucket("e2e-models")
    return upload_model(tiny_model, s3_server.client(), "e2e-models", "tiny/thaw")


async def usage_row(plane: ControlPlane, request_id: str) -> UsageEvent:
    await plane.flush_usage()
    async with plane.app.state.sessions() as session:
        return await session.scalar(select(UsageEvent).where(UsageEvent.request_id == request_id))


async def replica_count(plane: ControlPlane, revision_id: str) -> int:
    status = plane.app.state.pool.revision_status(revision_id)
    return sum(1 for r in status.replicas if r.state not in ("stopped", "failed"))


async def wait_for(predicate, timeout_s: float = 60.0) -> bool:
    """Bounded polling for a state change (not a timed assertion)."""
    for _ in range(int(timeout_s / 0.1)):
        if await predicate():
            return True
        await asyncio.sleep(0.1)
    return False


async def chat(client, request_id: str) -> dict:
    response = await client.post("/v1/chat/completions", json=CHAT,
                                 headers={"x-request-id": request_id})
    assert response.status_code == 200, response.text
    assert response.headers["x-request-id"] == request_id
    return response.json()


async def test_cold_warm_scale_to_zero_and_back(plane, model_uri):
    key = await plane.tenant_key("thaw-tenant")
    client = plane.client(key)
    created = await client.post("/v1/deployments", json={
        "name": "thaw", "model_uri": model_uri, "resources": {"gpu_memory_gb": 0.5},
        "scaling": {"min_replicas": 0, "max_replicas": 1, "target_concurrency": 4,
                    "idle_timeout_s": IDLE_TIMEOUT_S},
        "engine": {"kv_cache_tokens": 512}})
    assert created.status_code == 201, created.text
    revision_id = created.json()["revisions"][0]["id"]
    assert await replica_count(plane, revision_id) == 0, "nothing runs before the first request"

    started = time.monotonic()
    cold = await chat(client, "thaw-cold")
    waited_s = time.monotonic() - started
    cold_row = await usage_row(plane, "thaw-cold")
    assert cold_row.status == "ok" and cold_row.cold_start_s is not None
    assert 0 < cold_row.cold_start_s <= waited_s, "the thaw happened inside this request"
    assert cold_row.completion_tokens == 12

    warm = await chat(client, "thaw-warm")
    warm_row = await usage_row(plane, "thaw-warm")
    assert not warm_row.cold_start_s, "a warm request waits for no thaw"
    assert warm_row.replica_id == cold_row.replica_id
    whole_blocks = (warm_row.prompt_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE   # last token computed
    assert whole_blocks >= BLOCK_SIZE, "the prompt spans a whole block"
    assert cold_row.cached_tokens == 0 and warm_row.cached_tokens == whole_blocks, \
        "prefix cache hit is billed"
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == warm_row.cached_tokens
    assert warm["choices"][0]["message"] == cold["choices"][0]["message"]

    pool = plane.app.state.pool
    pool.clock.advance(IDLE_TIMEOUT_S - 5)                 # idle, but not for long enough
    await pool.tick()
    assert await replica_count(plane, revision_id) == 1, "kept until the idle timeout"
    pool.clock.advance(10)
    assert await wait_for(lambda: _is_zero(plane, revision_id)), "idle revision scaled to zero"

    again = await chat(client, "thaw-again")
    again_row = await usage_row(plane, "thaw-again")
    assert again_row.cold_start_s and again_row.replica_id != cold_row.replica_id
    assert again["choices"][0]["message"] == cold["choices"][0]["message"], "same greedy answer"


async def _is_zero(plane, revision_id) -> bool:
    return await replica_count(plane, revision_id) == 0


async def test_replica_killed_mid_stream(plane, model_uri):
    key = await plane.tenant_key("crash-tenant")
    client = plane.client(key)
    created = await client.post("/v1/deployments", json={
        "name": "crashy", "model_uri": model_uri, "resources": {"gpu_memory_gb": 0.5},
        "scaling": {"min_replicas": 0, "max_replicas": 1, "idle_timeout_s": 60},
        "engine": {"kv_cache_tokens": 512}})
    assert created.status_code == 201, created.text
    revision_id = created.json()["revisions"][0]["id"]
    body = {**CHAT, "model": "crashy", "max_tokens": 400, "stream": True,
            "messages": [{"role": "user", "content": "Tell me a long story"}]}
    chunks, delivered, error = 0, 0, None
    async with client.stream("POST", "/v1/chat/completions", json=body,
                             headers={"x-request-id": "crash-1"}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if "error" in event:
                error = event["error"]
                break
            chunks += 1
            delivered += bool(event["choices"] and event["choices"][0]["delta"].get("content"))
            if chunks == 3:
                _kill_ready_replica(plane, revision_id)
    assert chunks >= 3 and error is not None, "the client gets a clean error, not a hang"

    # the gateway bills the cut stream when it closes it, which may be just after the
    # client has read the error event
    row = await eventually(lambda: usage_row(plane, "crash-1"), timeout_s=30,
                           what="the usage row of the stream cut by the crash")
    assert row.status == "partial"
    # each content chunk the client got carries at least one token; the kill came long
    # before 400
    assert delivered >= 1 and delivered <= row.completion_tokens < 400, \
        ("billed for what was delivered", delivered, row.completion_tokens)

    fresh = await client.post("/v1/chat/completions", json={**CHAT, "model": "crashy"},
                              headers={"x-request-id": "crash-2"})
    assert fresh.status_code == 200, fresh.text
    fresh_row = await usage_row(plane, "crash-2")
    assert fresh_row.status == "ok" and fresh_row.replica_id != row.replica_id


def _kill_ready_replica(plane, revision_id: str) -> None:
    """SIGKILL the one runtime process serving the revision (a crash, not a drain)."""
    pool = plane.app.state.pool
    ready = [r for r in pool.revision_status(revision_id).replicas if r.state == "ready"]
    assert len(ready) == 1, ready
    os.kill(pool.handle(ready[0].replica_id).process.pid, signal.SIGKILL)
