"""Fallbacks over the real PoolManager, cold-starting real runtime replicas on CPU slots:
a cold deployment's call answered by a warm fallback after `cold_wait_s` while it keeps
warming up, and a deployment held back by its tenant's GPU quota answered by its
fallback, unary and streamed through the official client."""
from decimal import Decimal

import openai
import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.store.tables import UsageEvent
from tests.controlplane.conftest import cpu_pool_settings, make_settings, real_pool, running_control_plane
from tests.support.waiting import eventually

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(600)]
TENANT = "fbp"
PRICES = {"warm": Decimal("3"), "thaw": Decimal("1"), "capped": Decimal("1")}
SMALL = {"resources": {"gpu_memory_gb": 0.5}, "engine": {"kv_cache_tokens": 512}}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cp-fallbacks-pool")
    settings = make_settings(db_url, s3_server, tmp / "cp", acquire_timeout_s=240)
    pool_factory = real_pool(cpu_pool_settings(s3_server, tmp / "cache", cpu_slots=2))
    async with running_control_plane(settings, pool_factory=pool_factory) as plane:
        yield plane


async def ready(client, name: str) -> bool:
    status = (await client.get(f"/v1/deployments/{name}")).json()["status"]
    return status["r1"]["state"] == "ready"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def key(plane, model_uri):
    """warm (one replica kept up), thaw (cold; falls back to warm when cold) and capped
    (falls back to warm when cold or rate-limited), in a tenant allowed 2 GPUs."""
    key = await plane.tenant_key(TENANT)
    quota = await plane.admin.patch(f"/v1/tenants/{TENANT}/quota", json={"max_gpus": 2})
    assert quota.status_code == 200, quota.text
    client = plane.client(key)
    for name, extra in [
            ("warm", {"scaling": {"min_replicas": 1}}),
            ("thaw", {"fallbacks": [{"deployment": "warm", "on": ["cold"], "cold_wait_s": 0.5}]}),
            ("capped", {"fallbacks": [{"deployment": "warm", "on": ["cold", "rate_limited"],
                                       "cold_wait_s": 1}]})]:
        created = await client.post("/v1/deployments", json={"name": name, "model_uri": model_uri,
                                                              **SMALL, **extra})
        assert created.status_code == 201, created.text
        await plane.set_price(tenant=TENANT, deployment=name, input_per_mtok=str(PRICES[name]),
                              cached_input_per_mtok=str(PRICES[name]), output_per_mtok=str(PRICES[name]))
    await eventually(lambda: ready(client, "warm"), timeout_s=240, what="warm's replica ready")
    return key


async def usage_rows(plane, request_id: str) -> list[UsageEvent]:
    await plane.flush_usage()
    async with plane.app.state.sessions() as session:
        return list(await session.scalars(select(UsageEvent).where(UsageEvent.request_id == request_id)))


async def complete(plane, key: str, model: str, request_id: str):
    return await plane.client(key).post("/v1/completions", headers={"x-request-id": request_id}, json={
        "model": model, "prompt": "Hello", "max_tokens": 3, "ignore_eos": True})


async def test_a_cold_deployment_is_answered_by_its_warm_fallback_and_keeps_warming(plane, key):
    client = plane.client(key)
    assert not await ready(client, "thaw")
    answer = await complete(plane, key, "thaw", "fbp-cold")
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-thawpool-served-by"] == "warm"
    assert answer.headers["x-thawpool-fallback-reason"] == "cold"
    assert answer.json()["model"] == "warm"
    (row,) = await eventually(lambda: usage_rows(plane, "fbp-cold"), timeout_s=30, what="the call's row")
    assert (row.deployment_name, row.status, row.completion_tokens) == ("warm", "ok", 3)
    assert row.cost == PRICES["warm"] * (row.prompt_tokens + row.completion_tokens) / 1_000_000
    assert row.cold_start_s is None, "the warm replica answered: no thaw in this call"

    await eventually(lambda: ready(client, "thaw"), timeout_s=240,
                     what="thaw's replica, started by the call that fell back")
    again = await complete(plane, key, "thaw", "fbp-thawed")
    assert again.status_code == 200, again.text
    assert again.headers["x-thawpool-served-by"] == "thaw" and again.json()["model"] == "thaw"
    assert "x-thawpool-fallback-reason" not in again.headers


async def test_a_deployment_over_its_tenants_gpu_quota_is_answered_by_its_fallback(plane, key):
    client = plane.client(key)
    # warm and thaw hold the tenant's 2 GPUs: capped's replica waits for the quota
    await eventually(lambda: ready(client, "thaw"), timeout_s=240, what="thaw holding the second GPU")
    answer = await complete(plane, key, "capped", "fbp-quota")
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-thawpool-served-by"] == "warm"
    assert answer.headers["x-thawpool-fallback-reason"] == "rate_limited"
    (row,) = await eventually(lambda: usage_rows(plane, "fbp-quota"), timeout_s=30, what="the call's row")
    assert (row.deployment_name, row.status) == ("warm", "ok")
    status = (await client.get("/v1/deployments/capped")).json()["status"]["r1"]
    assert status["state"] == "waiting_for_capacity", status

    openai_client = openai.AsyncOpenAI(base_url=f"{plane.base_url}/v1", api_key=key, max_retries=0,
                                       timeout=280)
    try:
        raw = await openai_client.chat.completions.with_raw_response.create(
            model="capped", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
            extra_headers={"x-request-id": "fbp-stream"})
        assert raw.headers["x-thawpool-served-by"] == "warm"
        chunks = [chunk async for chunk in raw.parse()]
    finally:
        await openai_client.close()
    assert {c.model for c in chunks} == {"warm"} and chunks[-1].usage.completion_tokens == 4
    (row,) = await eventually(lambda: usage_rows(plane, "fbp-stream"), timeout_s=30, what="the stream's row")
    assert (row.deployment_name, row.status, row.completion_tokens) == ("warm", "ok", 4)
