"""Deployments, revisions, traffic and the pool's view of them, on real Postgres and S3."""
import json
from datetime import datetime, timedelta, timezone

import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.store.desired_state import PostgresDesiredState, PostgresReplicaEvents
from controlplane.store.tables import ReplicaLifetime
from controlplane.quotas import Quota
from pool.api import PinnedObject, ReplicaEvent, TenantQuota
from pool.s3 import parse_uri
from tests.controlplane.conftest import make_settings, running_control_plane

pytestmark = pytest.mark.asyncio(loop_scope="session")
QUOTA = Quota(max_gpus=8, max_queued_requests=256)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-deploy"))
    async with running_control_plane(settings) as plane:
        yield plane


@pytest.fixture(scope="module")
def gpt2_uri(s3_server, models_bucket):
    """A whole model folder (config.json and weights) of an architecture we do not run."""
    from safetensors.numpy import save
    import numpy as np

    s3 = s3_server.client()
    s3.put_object(Bucket=models_bucket, Key="archs/gpt2/config.json",
                  Body=json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    s3.put_object(Bucket=models_bucket, Key="archs/gpt2/model.safetensors",
                  Body=save({"wte.weight": np.zeros((8, 4), dtype=np.float32)}))
    return f"s3://{models_bucket}/archs/gpt2/"        # under the tenant "archs"'s own prefix


def body(name, model_uri, **extra):
    return {"name": name, "model_uri": model_uri,
            "resources": {"gpu_memory_gb": 2, "gpu_count": 1},
            "scaling": {"min_replicas": 0, "max_replicas": 2, "target_concurrency": 4,
                        "idle_timeout_s": 30},
            "engine": {"dtype": "float32"}, **extra}


async def test_create_get_list_delete(plane, model_uri):
    client = plane.client(await plane.tenant_key("crud"))
    created = await client.post("/v1/deployments", json=body("chat", model_uri))
    assert created.status_code == 201, created.text
    view = created.json()
    assert view["traffic"] == {"r1": 100}
    assert view["revisions"][0]["architecture"] == "LlamaForCausalLM"
    assert "pricing" not in view["revisions"][0], "prices live in the operator's book"
    assert (await client.get("/v1/deployments/chat")).json()["id"] == view["id"]
    assert [d["name"] for d in (await client.get("/v1/deployments")).json()["data"]] == ["chat"]
    assert (await client.post("/v1/deployments", json=body("chat", model_uri))).status_code == 409
    assert (await client.delete("/v1/deployments/chat")).status_code == 204
    assert (await client.get("/v1/deployments/chat")).status_code == 404
    again = await client.post("/v1/deployments", json=body("chat", model_uri))
    assert again.status_code == 201 and again.json()["id"] != view["id"]


@pytest.mark.parametrize("change, field", [
    ({"colour": "red"}, "colour"),
    ({"model_uri": "http://bucket/model/"}, "model_uri"),
    ({"model_uri": "s3://"}, "model_uri"),
    ({"scaling": {"min_replicas": 3, "max_replicas": 2}}, "scaling.min_replicas"),
    ({"scaling": {"max_replicas": 0}}, "scaling.max_replicas"),
    ({"scaling": {"target_concurrency": 1025}}, "scaling.target_concurrency"),
    ({"scaling": {"warp": 1}}, "scaling.warp"),
    ({"resources": {"gpu_count": 0}}, "resources.gpu_count"),
    ({"resources": {"gpu_memory_gb": "lots"}}, "resources.gpu_memory_gb"),
    ({"engine": {"turbo": True}}, "engine.turbo"),
    ({"engine": {"quantization": "int4"}}, "engine.quantization"),
    ({"engine": {"dtype": "auto"}}, "engine.dtype"),
    ({"engine": {"kv_cache_dtype": "fp8"}}, "engine.kv_cache_dtype"),
    ({"engine": {"batch_invariant": "yes"}}, "engine.batch_invariant"),
    ({"engine": {"tensor_parallel_size": 2}}, "engine.tensor_parallel_size"),   # != gpu_count
    ({"resources": {"gpu_count": 3}}, "resources.gpu_count"),     # 4 heads do not split 3 ways
    ({"resources": {"gpu_memory_gb": 4096}}, "resources"),        # no slot could ever hold it
    ({"name": "Has Spaces"}, "name"),
])
async def test_invalid_deployments_are_422_naming_the_field(plane, model_uri, change, field):
    client = plane.client(await plane.tenant_key("strict"))
    response = await client.post("/v1/deployments", json={**body("bad", model_uri), **change})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == field and error["message"].startswith(field)


async def test_a_change_of_model_reads_it_once_and_every_change_refreshes_the_pool(
        plane, model_uri):
    pool = plane.app.state.pool
    client = plane.client(await plane.tenant_key("reads"))
    inspected, refreshes = len(pool.inspected), pool.refreshes
    assert (await client.post("/v1/deployments", json=body("once", model_uri))).status_code == 201
    assert pool.inspected[inspected:] == [model_uri] and pool.refreshes == refreshes + 1
    scaled = await client.patch("/v1/deployments/once", json={"scaling": {"max_replicas": 3}})
    assert scaled.status_code == 200
    assert len(pool.inspected) == inspected + 1, "scaling alone reads no model"
    assert pool.refreshes == refreshes + 2
    assert (await client.patch("/v1/deployments/once",
                               json={"engine": {"seed": 2}})).status_code == 200
    assert pool.inspected[inspected:] == [model_uri, model_uri] and pool.refreshes == refreshes + 3
    assert (await client.delete("/v1/deployments/once")).status_code == 204
    assert pool.refreshes == refreshes + 4


async def test_model_is_checked_in_s3_at_deploy_time(plane, gpt2_uri, models_bucket):
    client = plane.client(await plane.tenant_key("archs"))
    response = await client.post("/v1/deployments", json=body("gpt", gpt2_uri))
    assert response.status_code == 422
    assert "GPT2LMHeadModel" in response.json()["error"]["message"]
    missing = await client.post("/v1/deployments",
                                json=body("gone", f"s3://{models_bucket}/archs/nothing-here/"))
    assert missing.status_code == 422 and missing.json()["error"]["param"] == "model_uri"


async def test_a_quantization_config_the_runtime_cannot_serve_is_a_422_naming_the_field(plane, s3_server,
                                                                                       models_bucket):
    from safetensors.numpy import save
    import numpy as np

    s3 = s3_server.client()
    s3.put_object(Bucket=models_bucket, Key="quant/gptq3/config.json", Body=json.dumps({
        "architectures": ["LlamaForCausalLM"],
        "quantization_config": {"quant_method": "gptq", "bits": 3, "group_size": 128}}))
    s3.put_object(Bucket=models_bucket, Key="quant/gptq3/model.safetensors",
                  Body=save({"w": np.zeros((8, 4), dtype=np.float32)}))
    client = plane.client(await plane.tenant_key("quant"))
    response = await client.post("/v1/deployments", json=body("q3", f"s3://{models_bucket}/quant/gptq3/"))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == "model_uri"
    assert "quantization_config.bits: 3 is not supported (4)" in error["message"]


async def test_bad_json_and_oversized_bodies(plane):
    client = plane.client(await plane.tenant_key("bodies"))
    broken = await client.post("/v1/deployments", content=b"{not json",
                               headers={"content-type": "application/json"})
    assert broken.status_code == 400 and broken.json()["error"]["param"] == "body"
    huge = await client.post("/v1/deployments", content=b"x" * 2_000_000)
    assert huge.status_code == 413


async def test_revisions_traffic_and_rollback(plane, model_uri, s3_server, tiny_model,
                                              models_bucket):
    from tests.support.model_factory import upload_model

    other_uri = upload_model(tiny_model, s3_server.client(), models_bucket, "tiny/llama-v2")
    client = plane.client(await plane.tenant_key("canary"))
    await client.post("/v1/deployments", json=body("svc", model_uri))
    scaled = await client.patch("/v1/deployments/svc", json={"scaling": {"max_replicas": 5}})
    assert scaled.status_code == 200
    assert len(scaled.json()["revisions"]) == 1, "scaling alone makes no revision"
    assert scaled.json()["scaling"]["max_replicas"] == 5
    r2 = await client.patch("/v1/deployments/svc",
                            json={"model_uri": other_uri, "promote": False})
    assert [r["name"] for r in r2.json()["revisions"]] == ["r1", "r2"]
    assert r2.json()["traffic"] == {"r1": 100}
    r1_before = r2.json()["revisions"][0]
    split = await client.post("/v1/deployments/svc/traffic", json={"r1": 90, "r2": 10})
    assert split.status_code == 200 and split.json()["traffic"] == {"r1": 90, "r2": 10}
    assert (await client.post("/v1/deployments/svc/traffic",
                              json={"r1": 50, "r2": 40})).status_code == 422
    r3 = await client.patch("/v1/deployments/svc", json={"engine": {"max_num_seqs": 4}})
    assert r3.json()["traffic"] == {"r3": 100}
    assert r3.json()["revisions"][2]["model_uri"] == other_uri, "unchanged parts carry over"
    assert r3.json()["revisions"][0] == r1_before, "revisions are immutable"
    rolled = await client.post("/v1/deployments/svc/rollback")
    assert rolled.status_code == 200 and rolled.json()["traffic"] == {"r2": 100}
    bad = await client.patch("/v1/deployments/svc", json={"scaling": {"min_replicas": 9}})
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "scaling.min_replicas"


async def test_another_tenants_deployments_are_404(plane, model_uri):
    owner = plane.client(await plane.tenant_key("owner-a"))
    other = plane.client(await plane.tenant_key("owner-b"))
    assert (await owner.post("/v1/deployments", json=body("private", model_uri))).status_code == 201
    for method, path, payload in [
            ("GET", "/v1/deployments/private", None),
            ("PATCH", "/v1/deployments/private", {"scaling": {"max_replicas": 3}}),
            ("DELETE", "/v1/deployments/private", None),
            ("POST", "/v1/deployments/private/traffic", {"r1": 100}),
            ("POST", "/v1/deployments/private/rollback", None)]:
        response = await other.request(method, path, json=payload)
        assert response.status_code == 404, (method, path)
    assert (await other.get("/v1/deployments")).json()["data"] == []
    # the same name is free in the other tenant
    assert (await other.post("/v1/deployments", json=body("private", model_uri))).status_code == 201


async def test_desired_state_lists_revisions_taking_traffic(plane, model_uri):
    client = plane.client(await plane.tenant_key("desired"))
    desired = PostgresDesiredState(plane.app.state.sessions, QUOTA, plane.app.state.sealer)
    created = (await client.post("/v1/deployments", json=body("ds", model_uri))).json()
    await client.patch("/v1/deployments/ds", json={"engine": {"seed": 1}, "promote": False})
    await client.post("/v1/deployments/ds/traffic", json={"r1": 50, "r2": 50})
    specs = [s for s in await desired.revisions()
             if s.deployment_id == created["id"]]
    assert {s.revision_id for s in specs} == {r["id"] for r in
                                              (await client.get("/v1/deployments/ds")).json()["revisions"]}
    assert all(s.max_replicas == 2 and s.model_uri == model_uri for s in specs)
    assert all(s.quota == TenantQuota(max_gpus=8, max_queued_requests=256) for s in specs), \
        "the default quota, for a tenant without overrides"
    overridden = await plane.admin.patch("/v1/tenants/desired/quota", json={"max_gpus": 3})
    assert overridden.status_code == 200, overridden.text
    specs = [s for s in await desired.revisions()
             if s.deployment_id == created["id"]]
    assert {s.quota for s in specs} == {TenantQuota(max_gpus=3, max_queued_requests=256)}, \
        "every spec carries its tenant's quota, the admin's overrides over the default"
    assert sorted(dict(s.engine).get("seed") for s in specs if "seed" in s.engine) == [1]
    await client.post("/v1/deployments/ds/traffic", json={"r2": 100})
    specs = [s for s in await desired.revisions()
             if s.deployment_id == created["id"]]
    assert len(specs) == 1 and specs[0].engine == {"dtype": "float32", "seed": 1}
    await client.delete("/v1/deployments/ds")
    assert not [s for s in await desired.revisions()
                if s.deployment_id == created["id"]]


async def test_replica_lifetimes_are_recorded(plane):
    sink = PostgresReplicaEvents(plane.app.state.sessions)
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    ids = dict(revision_id="00000000-0000-0000-0000-000000000001",
               deployment_id="00000000-0000-0000-0000-000000000002",
               tenant_id="00000000-0000-0000-0000-000000000003", gpu_count=2)
    for offset, state in [(0, "pending"), (5, "loading"), (9, "ready"), (60, "draining"),
                          (61, "stopped"), (70, "ready")]:
        await sink.replica_changed(ReplicaEvent(replica_id="rep-1", state=state,
                                                at=t0 + timedelta(seconds=offset),
                                                slot_ids=("gpu0", "gpu1"), **ids))
    async with plane.app.state.sessions() as session:
        row = await session.scalar(select(ReplicaLifetime).where(
            ReplicaLifetime.replica_id == "rep-1"))
    assert row.started_at == t0 and row.ready_at == t0 + timedelta(seconds=9)
    assert row.stopped_at == t0 + timedelta(seconds=61), "a stopped replica stays stopped"
    assert row.state == "stopped" and row.slot_ids == ["gpu0", "gpu1"]


async def test_concurrent_patches_cannot_undo_each_other(plane, model_uri):
    """Both PATCHes read the newest revision and write the next under the same lock: with
    a slow S3 (both are inside the model read at once), the last revision holds both."""
    import asyncio

    client = plane.client(await plane.tenant_key("racers"))
    assert (await client.post("/v1/deployments", json=body("race", model_uri))).status_code == 201
    pool = plane.app.state.pool
    pool.inspect_delay_s = 0.5
    try:
        first, second = await asyncio.gather(
            client.patch("/v1/deployments/race", json={"engine": {"seed": 7}}),
            client.patch("/v1/deployments/race", json={"engine": {"max_num_seqs": 3}}))
    finally:
        pool.inspect_delay_s = 0.0
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    revisions = (await client.get("/v1/deployments/race")).json()["revisions"]
    assert [r["name"] for r in revisions] == ["r1", "r2", "r3"]
    assert revisions[-1]["engine"] == {"dtype": "float32", "seed": 7, "max_num_seqs": 3}


@pytest.fixture(scope="module")
def oversized_config_uri(tiny_model, s3_server, models_bucket):
    """The tiny model with a config.json padded to 2 MiB (still valid JSON), under the tenant
    "caps"'s own prefix."""
    from tests.support.model_factory import upload_model

    uri = upload_model(tiny_model, s3_server.client(), models_bucket, "caps/padded")
    config = json.loads((tiny_model / "config.json").read_text())
    config["padding"] = "x" * (2 * 1024 * 1024)
    s3_server.client().put_object(Bucket=models_bucket, Key="caps/padded/config.json",
                                  Body=json.dumps(config))
    return uri


@pytest.fixture(scope="module")
def garbled_config_uri(tiny_model, s3_server, models_bucket):
    from tests.support.model_factory import upload_model

    uri = upload_model(tiny_model, s3_server.client(), models_bucket, "caps/garbled")
    s3_server.client().put_object(Bucket=models_bucket, Key="caps/garbled/config.json",
                                  Body=b"{not json")
    return uri


@pytest.mark.parametrize("which", ["oversized_config_uri", "garbled_config_uri"])
async def test_config_and_headers_are_read_with_caps(plane, which, request):
    client = plane.client(await plane.tenant_key("caps"))
    response = await client.post("/v1/deployments", json=body(
        f"capped-{which[:4]}", request.getfixturevalue(which)))
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == "model_uri"


async def test_a_revision_pins_the_objects_its_deploy_read(plane, model_uri, s3_server):
    """Their ETags and sizes reach the pool with the revision: a cold start refuses other bytes."""
    client = plane.client(await plane.tenant_key("pins"))
    created = await client.post("/v1/deployments", json=body("pinned", model_uri))
    assert created.status_code == 201, created.text
    desired = PostgresDesiredState(plane.app.state.sessions, QUOTA, plane.app.state.sealer)
    (spec,) = [s for s in await desired.revisions() if s.deployment_id == created.json()["id"]]
    bucket, prefix = parse_uri(model_uri)
    listed = s3_server.client().list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]
    assert spec.pins == {f"s3://{bucket}/{o['Key']}": PinnedObject(o["ETag"].strip('"'), o["Size"])
                         for o in listed}
    assert any(uri.endswith("/model.safetensors") for uri in spec.pins)
    await client.delete("/v1/deployments/pinned")


async def test_target_concurrency_has_an_upper_bound_on_create_and_patch(plane, model_uri):
    """A replica is given at most 1024 requests before another starts: past it a deployment
    would pile its load onto one replica instead of scaling."""
    client = plane.client(await plane.tenant_key("bounded"))
    made = await client.post("/v1/deployments", json={
        **body("bounded", model_uri), "scaling": {"target_concurrency": 1024}})
    assert made.status_code == 201, made.text
    refused = await client.patch("/v1/deployments/bounded",
                                 json={"scaling": {"target_concurrency": 1025}})
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["param"] == "scaling.target_concurrency" and "max_replicas" in error["message"]
    shown = (await client.get("/v1/deployments/bounded")).json()
    assert shown["scaling"]["target_concurrency"] == 1024, "the refusal changed nothing"
