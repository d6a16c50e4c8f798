"""Prefetch through the real control plane and pool: a deployment created with
`scaling.prefetch: true` has its weights in the pool's cache, as its status says
(`weights_cached`), with no invocation and no replica started; one without it does not."""
import pytest
import pytest_asyncio

from tests.controlplane.conftest import pooled_control_plane
from tests.support.waiting import eventually

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(300)]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    async with pooled_control_plane(db_url, s3_server, tmp_path_factory.mktemp("cp-prefetch")) as plane:
        yield plane


async def test_a_deployment_with_prefetch_has_its_weights_cached_before_any_request(plane, model_uri):
    client = plane.client(await plane.tenant_key("prefetcher"))
    created = await client.post("/v1/deployments", json={
        "name": "warmed", "model_uri": model_uri, "resources": {"gpu_memory_gb": 0.5},
        "engine": {"kv_cache_tokens": 512}, "scaling": {"min_replicas": 0, "prefetch": True}})
    assert created.status_code == 201, created.text
    assert created.json()["scaling"]["prefetch"] is True

    async def revision_status():
        return (await client.get("/v1/deployments/warmed")).json()["status"]["r1"]

    async def cached():
        status = await revision_status()
        return status if status["weights_cached"] else None

    status = await eventually(cached, timeout_s=120, what="weights_cached on the deployment's status")
    assert status["replicas"] == [] and status["prefetch_error"] is None, "no replica, no invocation"
    assert (await client.delete("/v1/deployments/warmed")).status_code in (200, 204)


async def test_prefetch_is_off_by_default_and_must_be_a_boolean(plane, model_uri):
    client = plane.client(await plane.tenant_key("plain"))
    refused = await client.post("/v1/deployments", json={
        "name": "plain", "model_uri": model_uri, "scaling": {"prefetch": "yes"}})
    assert refused.status_code == 422, refused.text
    created = await client.post("/v1/deployments", json={
        "name": "plain", "model_uri": model_uri, "resources": {"gpu_memory_gb": 0.5}})
    assert created.status_code == 201, created.text
    assert created.json()["scaling"]["prefetch"] is False
    status = (await client.get("/v1/deployments/plain")).json()["status"]["r1"]
    assert status["weights_cached"] is False
    assert (await client.delete("/v1/deployments/plain")).status_code in (200, 204)
