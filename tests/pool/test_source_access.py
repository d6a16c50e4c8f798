"""A tenant's own bucket, read with the credentials an admin granted it: a second real
S3 server (SeaweedFS) stands for the tenant's, with keys the platform does not have.

The pool asks its DesiredStateSource for the tenant's access at inspection and cold
start; another tenant, or the platform's own credentials, cannot read there; the
cache keeps the tenant's objects under keys of their own; the secret never shows in
a repr.
"""
from __future__ import annotations

import uuid
from contextlib import AsyncExitStack

import pytest

from pool.api import ModelUnavailable, RevisionSpec, S3Access
from pool.in_memory import EventLog, InMemoryDesiredState
from pool.manager import PoolManager
from pool.s3 import S3Object, access_for
from pool.weights.cache import entry_key
from tests.support.replica_client import replica_http
from tests.pool.conftest import make_settings
from tests.support.model_factory import upload_model
from spec.engine_options import ChosenOptions

pytestmark = [pytest.mark.timeout(240)]
TENANT, OTHER = "ten-acme", "ten-other"


@pytest.fixture(scope="module")
def tenant_s3(tmp_path_factory):
    """The tenant's own S3: another endpoint, other keys."""
    from controlplane.embedded import EmbeddedS3

    server = EmbeddedS3(tmp_path_factory.mktemp("tenant-s3"))
    server.access_key, server.secret_key = "acme-key", "acme-secret-" + uuid.uuid4().hex
    server.start()
    try:
        server.ensure_bucket("acme-own")
        yield server
    finally:
        server.stop()


def test_the_longest_granted_prefix_wins():
    wide = S3Access("k1", "s1")
    narrow = S3Access("k2", "s2", endpoint_url="http://127.0.0.1:9")
    grants = {"s3://b/": wide, "s3://b/team/": narrow}
    assert access_for("s3://b/team/m/", grants) is narrow
    assert access_for("s3://b/other/", grants) is wide
    assert access_for("s3://c/m/", grants) is None
    assert "s2" not in repr(narrow) and "s1" not in repr(wide)


def test_a_tenant_endpoint_cannot_name_a_platform_cache_entry():
    platform = S3Object("b", "m/model.safetensors", 10, "etag")
    assert entry_key(platform) != entry_key(S3Object("b", "m/model.safetensors", 10, "etag",
                                                     origin=S3Access("k", "s").origin))


@pytest.mark.asyncio(loop_scope="session")
async def test_a_granted_bucket_is_read_with_its_own_credentials(s3_server, tenant_s3, tiny_model, tmp_path):
    uri = upload_model(tiny_model, tenant_s3.client(), "acme-own", f"{uuid.uuid4().hex[:8]}/tiny")
    access = S3Access(tenant_s3.access_key, tenant_s3.secret_key, endpoint_url=tenant_s3.endpoint)
    desired, events = InMemoryDesiredState(), EventLog()
    desired.grants[TENANT] = {"s3://acme-own/": access}
    settings = make_settings(s3_server, tmp_path, cpu_slots=1, slot_memory_gb=1, warm_pool_size=0,
                             tick_s=0.2, runtime_threads=1, kv_cache_tokens_default=512,
                             load_timeout_s=120, pull_timeout_s=60)
    manager = PoolManager(settings, desired, events)
    async with AsyncExitStack() as stack:
        await manager.start()
        stack.push_async_callback(manager.stop)
        info = await manager.inspect_model(uri, TENANT)
        assert info.architecture == "LlamaForCausalLM"
        for who in (OTHER, None):            # the platform's own keys and endpoint: nothing there
            with pytest.raises(ModelUnavailable):
                await manager.inspect_model(uri, who)

        spec = RevisionSpec(revision_id=f"rev-{uuid.uuid4().hex[:8]}", deployment_id="dep-acme",
                            tenant_id=TENANT, model_uri=uri, gpu_memory_gb=0.25,
                            engine=ChosenOptions({"kv_cache_tokens": 512}))
        desired.put(spec)
        lease = await manager.acquire(spec, request_id="own-1", prefix_key=None, prompt_tokens=1,
                                      timeout_s=180)
        async with lease, replica_http(timeout=60, headers=lease.headers) as client:
            resp = await client.post(f"{lease.base_url}/v1/completions", json={
                "model": spec.revision_id, "prompt": "hello", "max_tokens": 2, "temperature": 0})
        assert resp.status_code == 200, resp.text

        store = await manager._running.cold_start.stores.store_for(TENANT, uri)
        objects = await store.list_model(uri)
        assert {o.origin for o in objects} == {access.origin}
        cached = {p.name for p in (settings.cache_dir / "objects").iterdir()}
        assert {entry_key(o) for o in objects} <= cached


@pytest.mark.asyncio(loop_scope="session")
async def test_an_adapter_in_a_granted_bucket_is_read_with_its_own_credentials(s3_server, tenant_s3, tmp_path):
    import json

    from tests.pool.test_adapter_inspection import CONFIG, weights

    prefix = f"{uuid.uuid4().hex[:8]}/adapter"
    own = tenant_s3.client()
    own.put_object(Bucket="acme-own", Key=f"{prefix}/adapter_config.json", Body=json.dumps(CONFIG).encode())
    own.put_object(Bucket="acme-own", Key=f"{prefix}/adapter_model.safetensors", Body=weights())
    uri = f"s3://acme-own/{prefix}/"
    desired = InMemoryDesiredState()
    desired.grants[TENANT] = {"s3://acme-own/": S3Access(tenant_s3.access_key, tenant_s3.secret_key,
                                                         endpoint_url=tenant_s3.endpoint)}
    manager = PoolManager(make_settings(s3_server, tmp_path, cpu_slots=1, warm_pool_size=0), desired, EventLog())
    async with AsyncExitStack() as stack:
        await manager.start()
        stack.push_async_callback(manager.stop)
        info = await manager.inspect_adapter(uri, TENANT)
        assert json.loads(info.config) == CONFIG and info.weight_bytes == len(weights())
        assert set(info.objects) == {f"{uri}adapter_config.json", f"{uri}adapter_model.safetensors"}
        for who in (OTHER, None):            # the platform's own keys and endpoint: nothing there
            with pytest.raises(ModelUnavailable):
                await manager.inspect_adapter(uri, who)
