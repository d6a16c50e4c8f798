"""Function deployments through the control plane and the real pool: deploy from S3, invoke
(batched), bill, refuse bad input and other tenants, crash -> clean error and a new
replica, revisions and rollback, scale to zero and back."""
import asyncio
from decimal import Decimal

import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.store.tables import UsageEvent
from tests.controlplane.conftest import cpu_pool_settings, make_settings, real_pool, running_control_plane
from tests.support.waiting import eventually

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(300)]


def upload(folder, s3_server, bucket, prefix) -> str:
    """Every file of a package (sub-folders kept) under s3://bucket/prefix/."""
    client = s3_server.client()
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        client.upload_file(str(file), bucket, f"{prefix}/{file.relative_to(folder)}")
    return f"s3://{bucket}/{prefix}/"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fn-plane")
    settings = make_settings(db_url, s3_server, tmp / "cp", acquire_timeout_s=120)
    pool = real_pool(cpu_pool_settings(s3_server, tmp / "cache", cpu_slots=2, load_timeout_s=120))
    async with running_control_plane(settings, pool_factory=pool) as plane:
        yield plane


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def probe(plane, probe_package, s3_server, models_bucket):
    """Tenant fn-acme's probe function (batches of 4, waiting for a full one), deployed."""
    key = await plane.tenant_key("fn-acme")
    uri = upload(probe_package(max_batch_size=4), s3_server, models_bucket, "fn-acme/probe")
    created = await plane.client(key).post("/v1/deployments", json={
        "name": "probe", "kind": "function", "model_uri": uri,
        "scaling": {"min_replicas": 0, "max_replicas": 1, "idle_timeout_s": 300}})
    assert created.status_code == 201, created.text
    return key, created.json()


async def invoke_all(client, name, bodies, **params):
    return await asyncio.gather(*(client.post(f"/v1/functions/{name}/invoke", json=b, params=params)
                                  for b in bodies))


async def usage_rows(plane, deployment_id):
    await plane.flush_usage()
    async with plane.app.state.sessions() as session:
        rows = await session.scalars(select(UsageEvent).where(UsageEvent.deployment_id == deployment_id))
        return list(rows)


async def test_deploy_invoke_batched_and_billed_per_call(plane, probe):
    key, deployment = probe
    assert deployment["kind"] == "function"
    assert deployment["revisions"][0]["architecture"] == "thawpool-function"
    await plane.set_price(tenant="fn-acme", input_per_mtok="0", cached_input_per_mtok="0",
                          output_per_mtok="0", gpu_second="0.001", per_call="0.0002")
    client = plane.client(key)
    answers = await invoke_all(client, "probe", [{"input": {"echo": i}} for i in range(4)],
                               )
    assert [a.status_code for a in answers] == [200] * 4, answers[0].text
    outputs = [a.json()["output"] for a in answers]
    assert [o["echo"] for o in outputs] == [0, 1, 2, 3] and {o["batch"] for o in outputs} == {4}
    assert len({o["instance"] for o in outputs}) == 1
    assert all(a.json()["usage"]["items"] == 1 and a.json()["usage"]["gpu_seconds"] > 0 for a in answers)
    assert answers[0].headers["x-thawpool-revision"] == "r1"

    rows = await usage_rows(plane, deployment["id"])
    assert len(rows) == 4 and {r.endpoint for r in rows} == {"functions/invoke"}
    assert {r.status for r in rows} == {"ok"} and {r.items for r in rows} == {1}
    assert all(r.gpu_seconds > 0 and r.prompt_tokens == 0 for r in rows)
    assert {r.cost for r in rows} == {Decimal("0.0002")}
    report = await client.get("/v1/billing/report", params={"from": "2020-01-01", "to": "2100-01-01",
                                                            "group_by": "deployment"})
    assert report.status_code == 200 and "probe" in report.text


async def test_a_function_call_is_held_against_its_budget_and_settles_at_its_price(plane, probe):
    """The per-call price is a function call's worst case: a budget with no room refuses
    it (sync or async) with 429 budget_exceeded and no usage row; one with room settles
    it to the billed cost (a budget set now starts from the month's billed rows)."""
    key, deployment = probe
    client = plane.client(key)
    before = await usage_rows(plane, deployment["id"])
    empty = await client.put("/v1/budgets", json={"scope": "deployment", "deployment": "probe", "limit": "0"})
    assert empty.status_code == 201, empty.text
    for params in ({}, {"async": "true"}):
        refused = await client.post("/v1/functions/probe/invoke", json={"input": {"echo": 1}}, params=params)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exceeded"
        assert empty.json()["id"] in refused.json()["error"]["message"]
    assert len(await usage_rows(plane, deployment["id"])) == len(before)
    roomy = await client.put("/v1/budgets", json={"scope": "deployment", "deployment": "probe", "limit": "1"})
    assert roomy.status_code == 200 and Decimal(roomy.json()["spent"]) == sum(r.cost for r in before)
    answers = await invoke_all(client, "probe", [{"input": {"echo": i}} for i in range(4)])   # one batch
    assert [a.status_code for a in answers] == [200] * 4, answers[0].text
    rows = await usage_rows(plane, deployment["id"])
    view = (await client.get(f"/v1/budgets/{roomy.json()['id']}")).json()
    assert (Decimal(view["spent"]), Decimal(view["reserved"])) == (sum(r.cost for r in rows), 0)
    assert (await client.delete(f"/v1/budgets/{roomy.json()['id']}")).status_code == 204


async def test_refusals_come_before_any_replica_and_write_no_usage(plane, probe, s3_server, models_bucket):
    key, deployment = probe
    client = plane.client(key)
    before = len(await usage_rows(plane, deployment["id"]))
    bad_json = await client.post("/v1/functions/probe/invoke", content=b"{nope")
    bad_item = await client.post("/v1/functions/probe/invoke", json={"inputs": [{"echo": 1}, 5]})
    too_big = await client.post("/v1/functions/probe/invoke",
                                json={"input": {"blob": "x" * (plane.app.state.settings.max_body_bytes + 1)}})
    missing = await client.post("/v1/functions/nope/invoke", json={"input": {}})
    as_chat = await client.post("/v1/chat/completions", json={
        "model": "probe", "messages": [{"role": "user", "content": "hi"}]})
    assert (bad_json.status_code, bad_json.json()["error"]["param"]) == (400, "body")
    assert (bad_item.status_code, bad_item.json()["error"]["param"]) == (400, "inputs[1]")
    assert too_big.status_code == 413 and missing.status_code == 404
    assert as_chat.status_code == 400 and as_chat.json()["error"]["code"] == "wrong_kind"
    assert len(await usage_rows(plane, deployment["id"])) == before

    other = plane.client(await plane.tenant_key("fn-other"))
    assert (await other.post("/v1/functions/probe/invoke", json={"input": {}})).status_code == 404
    uri = deployment["revisions"][0]["model_uri"]
    stolen = await other.post("/v1/deployments", json={"name": "stolen", "kind": "function", "model_uri": uri})
    assert stolen.status_code == 403                      # another tenant's prefix
    as_model = await client.post("/v1/deployments", json={"name": "as-model", "model_uri": uri})
    assert as_model.status_code == 422 and "kind" in as_model.json()["error"]["message"]
    with_engine = await client.post("/v1/deployments", json={
        "name": "engine", "kind": "function", "model_uri": uri, "engine": {"dtype": "float32"}})
    assert with_engine.status_code == 422 and with_engine.json()["error"]["param"] == "engine"


async def test_a_crash_mid_call_is_a_clean_502_and_the_replica_is_replaced(plane, probe):
    key, _ = probe
    client = plane.client(key)
    first = await invoke_all(client, "probe", [{"inputs": [{"echo": 0}] * 4}])
    crashed = await invoke_all(client, "probe", [{"inputs": [{"exit": 3}, {}, {}, {}]}])
    assert crashed[0].status_code == 502 and crashed[0].json()["error"]["code"] == "replica_failed"

    async def served_again():
        answer = (await invoke_all(client, "probe", [{"inputs": [{"echo": 1}] * 4}]))[0]
        return answer.json()["outputs"][0] if answer.status_code == 200 else None
    again = await eventually(served_again, timeout_s=120, what="a new replica serves", every_s=0.5)
    assert again["instance"] != first[0].json()["outputs"][0]["instance"]


async def test_revisions_rollback_and_async_calls(plane, probe, probe_package, s3_server, models_bucket):
    key, _ = probe
    client = plane.client(key)
    v2 = probe_package(max_batch_size=1, max_wait_ms=0)
    (v2 / "weights.txt").write_text("probe-weights-v2\n")
    patched = await client.patch("/v1/deployments/probe", json={
        "model_uri": upload(v2, s3_server, models_bucket, "fn-acme/probe-v2")})
    assert patched.status_code == 200 and patched.json()["traffic"] == {"r2": 100}
    one = (await invoke_all(client, "probe", [{"input": {"echo": "v2"}}]))[0]
    assert one.json()["output"]["weights"] == "probe-weights-v2" and one.headers["x-thawpool-revision"] == "r2"

    queued = await client.post("/v1/functions/probe/invoke", params={"async": "true"},
                               json={"input": {"echo": "later"}})
    assert queued.status_code == 202 and queued.json()["status"] == "running"
    call_id = queued.json()["id"]

    async def finished():
        view = (await client.get(f"/v1/functions/calls/{call_id}")).json()
        return view if view["status"] != "running" else None
    view = await eventually(finished, timeout_s=120, what="the async call finishes", every_s=0.2)
    assert view["status"] == "succeeded" and view["output"]["echo"] == "later"
    other = plane.client(await plane.tenant_key("fn-other"))
    assert (await other.get(f"/v1/functions/calls/{call_id}")).status_code == 404

    rolled = await client.post("/v1/deployments/probe/rollback")
    assert rolled.json()["traffic"] == {"r1": 100}
    back = await invoke_all(client, "probe", [{"inputs": [{"echo": 0}] * 4}])
    assert back[0].json()["outputs"][0]["weights"] == "probe-weights-v1"


async def test_scales_to_zero_and_thaws_on_the_next_call(plane, probe_package, s3_server, models_bucket):
    key = await plane.tenant_key("fn-acme")
    client = plane.client(key)
    uri = upload(probe_package(max_batch_size=2, max_wait_ms=1), s3_server, models_bucket, "fn-acme/idle")
    created = await client.post("/v1/deployments", json={
        "name": "idle", "kind": "function", "model_uri": uri,
        "scaling": {"min_replicas": 0, "max_replicas": 1, "idle_timeout_s": 1}})
    assert created.status_code == 201, created.text
    revision_id = created.json()["revisions"][0]["id"]
    first = (await invoke_all(client, "idle", [{"input": {"echo": 1}}]))[0]
    assert first.status_code == 200, first.text
    pool = plane.app.state.pool
    await eventually(lambda: pool.revision_status(revision_id).state == "scaled_to_zero",
                     timeout_s=60, what="the function scales to zero")
    thawed = (await invoke_all(client, "idle", [{"input": {"echo": 2}}]))[0]
    assert thawed.status_code == 200 and thawed.json()["output"]["instance"] != first.json()["output"]["instance"]
    rows = await usage_rows(plane, created.json()["id"])
    assert any(r.cold_start_s is not None for r in rows)
