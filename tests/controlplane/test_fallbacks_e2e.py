"""Fallbacks behind the real gateway, Postgres and S3: deploy-time checks, and a call whose
deployment's replica fails (a 5xx, or gone) answered by its fallback's real runtime
replica, named in the answer and billed to it. The failing replica is a server that
fails on purpose: a replica's 5xx cannot be caused on the tiny model. Cold starts and
the GPU quota, which the real pool causes, are in test_fallbacks_pool_e2e."""
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Optional

import openai
import pytest
import pytest_asyncio
from sqlalchemy import select
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from controlplane.store.tables import UsageEvent
from pool.api import AdapterRef, PoolError, QueueFull, RevisionSpec
from tests.controlplane.conftest import make_settings, running_control_plane
from tests.controlplane.support.servers import serve
from tests.controlplane.support.static_pool import Acquired, StaticLease, StaticPool
from tests.support.waiting import eventually
from wire.errors import error_body

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(300)]
TENANT = "fb-owner"
DEAD_URL = "http://127.0.0.1:9"          # the discard port: nothing answers there
PRICES = {"primary": Decimal("1"), "backup": Decimal("7")}     # per million tokens, each way


@dataclass
class RoutedPool(StaticPool):
    """A StaticPool that leases each deployment (by id) its own server, or refuses it."""
    routes: dict[str, str] = field(default_factory=dict)
    refusals: dict[str, PoolError] = field(default_factory=dict)

    async def acquire(self, spec: RevisionSpec, *, request_id: str, prefix_key: Optional[str],
                      prompt_tokens: int, timeout_s: float,
                      adapter: Optional[AdapterRef] = None, priority: int = 0) -> StaticLease:
        if spec.deployment_id in self.refusals:
            raise self.refusals[spec.deployment_id]
        lease = StaticLease(self.routes[spec.deployment_id], f"routed-{len(self.calls)}",
                            spec.revision_id, queue_s=0.001)
        self.calls.append(Acquired(spec, request_id, prefix_key, prompt_tokens, timeout_s, lease, adapter,
                                   priority))
        return lease


async def failing_replica(request: Request) -> JSONResponse:
    return JSONResponse(error_body("the engine died: illegal memory access", 500), 500)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def setup(db_url, s3_server, tmp_path_factory, runtime_replica):
    app = Starlette(routes=[Route(f"/v1/{e}", failing_replica, methods=["POST"])
                            for e in ("completions", "chat/completions")])
    async with serve(app) as failing_url:
        settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-fallbacks"))
        pool = RoutedPool(settings.s3_endpoint, settings.aws_access_key_id,
                          settings.aws_secret_access_key)
        await pool.start()
        try:
            async with running_control_plane(settings, pool=pool) as plane:
                yield plane, pool, failing_url
        finally:
            await pool.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def deployed(setup, model_uri, runtime_replica):
    """primary (falls back to backup on error) and backup, whose replica is real."""
    plane, pool, failing_url = setup
    key = await plane.tenant_key(TENANT)
    client = plane.client(key)
    backup = await client.post("/v1/deployments", json={"name": "backup", "model_uri": model_uri})
    assert backup.status_code == 201, backup.text
    primary = await client.post("/v1/deployments", json={
        "name": "primary", "model_uri": model_uri,
        "fallbacks": [{"deployment": "backup", "on": ["error", "rate_limited"]}]})
    assert primary.status_code == 201, primary.text
    assert primary.json()["fallbacks"] == [
        {"deployment": "backup", "on": ["rate_limited", "error"], "cold_wait_s": 5.0}]
    ids = {"primary": primary.json()["id"], "backup": backup.json()["id"]}
    pool.routes.update({ids["primary"]: failing_url, ids["backup"]: runtime_replica.base_url})
    for name, price in PRICES.items():
        await plane.set_price(tenant=TENANT, deployment=name, input_per_mtok=str(price),
                              cached_input_per_mtok=str(price), output_per_mtok=str(price))
    return key, ids


async def usage_rows(plane, request_id: str, count: int) -> list[UsageEvent]:
    async def rows():
        await plane.flush_usage()
        async with plane.app.state.sessions() as session:
            found = list(await session.scalars(select(UsageEvent).where(
                UsageEvent.request_id == request_id).order_by(UsageEvent.started_at)))
        return found if len(found) >= count else None
    return await eventually(rows, timeout_s=30, what=f"{count} usage row(s) of {request_id}")


async def test_a_5xx_of_the_primary_is_answered_by_its_fallback_and_billed_to_it(setup, deployed):
    plane, pool, _ = setup
    key, ids = deployed
    before = len(pool.calls)
    answer = await plane.client(key).post("/v1/completions", headers={"x-request-id": "fb-5xx"}, json={
        "model": "primary", "prompt": "Hello", "max_tokens": 4, "ignore_eos": True})
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-thawpool-served-by"] == "backup"
    assert answer.headers["x-thawpool-fallback-reason"] == "error"
    assert answer.json()["model"] == "backup"
    tried = pool.calls[before:]
    assert [c.spec.deployment_id for c in tried] == [ids["primary"], ids["backup"]]
    assert tried[0].lease.failed and not tried[1].lease.failed, "the failing replica is checked"

    failed, served = await usage_rows(plane, "fb-5xx", 2)
    assert (failed.deployment_name, failed.status, failed.cost) == ("primary", "error", 0)
    assert (failed.prompt_tokens, failed.completion_tokens) == (0, 0)
    assert (served.deployment_name, served.status, served.deployment_id) == ("backup", "ok", ids["backup"])
    assert served.completion_tokens == 4
    tokens = served.prompt_tokens + served.completion_tokens
    assert served.cost == PRICES["backup"] * tokens / 1_000_000, "at the fallback's price"


async def test_streaming_through_a_fallback_when_the_primary_is_unreachable(setup, deployed, runtime_replica):
    plane, pool, _ = setup
    key, ids = deployed
    pool.routes[ids["primary"]] = DEAD_URL
    client = openai.AsyncOpenAI(base_url=f"{plane.base_url}/v1", api_key=key, max_retries=0)
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model="primary", messages=[{"role": "user", "content": "Hi"}], max_tokens=5, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
            extra_headers={"x-request-id": "fb-stream"})
        assert raw.headers["x-thawpool-served-by"] == "backup"
        assert raw.headers["x-thawpool-fallback-reason"] == "error"
        chunks = [chunk async for chunk in raw.parse()]
    finally:
        await client.close()
        pool.routes[ids["primary"]] = setup[2]
    assert {c.model for c in chunks} == {"backup"}
    assert chunks[-1].usage.completion_tokens == 5
    failed, served = await usage_rows(plane, "fb-stream", 2)
    assert (failed.deployment_name, failed.status, failed.cost) == ("primary", "error", 0)
    assert (served.deployment_name, served.status, served.completion_tokens) == ("backup", "ok", 5)


async def test_a_condition_no_fallback_lists_answers_as_without_fallbacks(setup, deployed, model_uri):
    plane, pool, _ = setup
    key, ids = deployed
    client = plane.client(key)
    only_cold = await client.patch("/v1/deployments/primary", json={
        "fallbacks": [{"deployment": "backup", "on": ["cold"]}]})
    assert only_cold.status_code == 200, only_cold.text
    assert only_cold.json()["fallbacks"][0]["on"] == ["cold"]
    before = len(pool.calls)
    answer = await client.post("/v1/completions", json={"model": "primary", "prompt": "Hi", "max_tokens": 2})
    assert answer.status_code == 502 and answer.json()["error"]["code"] == "upstream_error"
    assert answer.headers["x-thawpool-served-by"] == "primary"
    assert "x-thawpool-fallback-reason" not in answer.headers
    assert [c.spec.deployment_id for c in pool.calls[before:]] == [ids["primary"]]
    restored = await client.patch("/v1/deployments/primary", json={
        "fallbacks": [{"deployment": "backup", "on": ["error", "rate_limited"]}]})
    assert restored.status_code == 200, restored.text


async def test_the_pools_429_goes_to_the_fallback_and_without_one_reaches_the_client(setup, deployed):
    plane, pool, _ = setup
    key, ids = deployed
    client = plane.client(key)
    pool.refusals[ids["primary"]] = QueueFull("8 requests already wait", retry_after_s=1.0)
    try:
        answer = await client.post("/v1/completions", json={"model": "primary", "prompt": "Hi", "max_tokens": 2})
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-thawpool-fallback-reason"] == "rate_limited"
        assert answer.json()["model"] == "backup"
        pool.refusals[ids["backup"]] = QueueFull("8 requests already wait", retry_after_s=1.0)
        refused = await client.post("/v1/completions", json={"model": "primary", "prompt": "Hi", "max_tokens": 2})
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "queue_full"
    finally:
        pool.refusals.clear()


async def test_fallbacks_are_checked_at_deploy_naming_the_field(setup, deployed, model_uri):
    plane, _, _ = setup
    key, _ = deployed
    client = plane.client(key)
    stranger = plane.client(await plane.tenant_key("fb-stranger"))
    theirs = await stranger.post("/v1/deployments", json={"name": "theirs", "model_uri": model_uri})
    assert theirs.status_code == 201, theirs.text

    async def refused(body: dict, field: str, path: str = "/v1/deployments", method: str = "post") -> str:
        answer = await getattr(client, method)(path, json=body)
        assert answer.status_code == 422, answer.text
        error = answer.json()["error"]
        assert (error["code"], error["param"]) == ("invalid_field", field), error
        return error["message"]

    message = await refused({"name": "leaky", "model_uri": model_uri,
                             "fallbacks": [{"deployment": "theirs"}]}, "fallbacks[0].deployment")
    assert "no deployment named 'theirs'" in message, "another tenant's reads as absent"
    await refused({"name": "selfish", "model_uri": model_uri,
                   "fallbacks": [{"deployment": "selfish"}]}, "fallbacks[0].deployment")
    await refused({"fallbacks": [{"deployment": "primary"}]}, "fallbacks[0].deployment",
                  "/v1/deployments/primary", "patch")
    await refused({"name": "typo", "model_uri": model_uri,
                   "fallbacks": [{"deployment": "backup", "on": ["slow"]}]}, "fallbacks[0].on")
    embed = await client.post("/v1/deployments", json={"name": "vectors", "model_uri": model_uri,
                                                       "engine": {"task": "embed"}})
    assert embed.status_code == 201, embed.text
    message = await refused({"name": "chatty", "model_uri": model_uri,
                             "fallbacks": [{"deployment": "vectors"}]}, "fallbacks[0].deployment")
    assert "'embed' task" in message
    listed = (await client.get("/v1/deployments")).json()["data"]
    assert {d["name"] for d in listed} == {"primary", "backup", "vectors"}, "nothing refused was made"
    # the names of each other is allowed: a fallback's own fallbacks are never followed
    mutual = await client.patch("/v1/deployments/backup", json={"fallbacks": [{"deployment": "primary"}]})
    assert mutual.status_code == 200, mutual.text
    cleared = await client.patch("/v1/deployments/backup", json={"fallbacks": []})
    assert cleared.status_code == 200 and cleared.json()["fallbacks"] == []


async def test_a_responses_api_call_falls_back_too_and_names_who_answered(setup, deployed):
    """/v1/responses runs the same attempts as chat: the primary's 5xx goes to the fallback,
    the response object and the stored response name it, and it bills the call."""
    plane, pool, _ = setup
    key, ids = deployed
    before = len(pool.calls)
    answer = await plane.client(key).post("/v1/responses", headers={"x-request-id": "fb-resp"}, json={
        "model": "primary", "input": "Hello", "max_output_tokens": 4})
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-thawpool-served-by"] == "backup"
    assert answer.json()["model"] == "backup"
    assert [c.spec.deployment_id for c in pool.calls[before:]] == [ids["primary"], ids["backup"]]
    stored = await plane.client(key).get(f"/v1/responses/{answer.json()['id']}")
    assert stored.status_code == 200 and stored.json()["model"] == "backup", stored.text

    failed, served = await usage_rows(plane, "fb-resp", 2)
    assert (failed.deployment_name, failed.status, failed.cost) == ("primary", "error", 0)
    assert (served.deployment_name, served.status, served.endpoint) == ("backup", "ok", "responses")


async def test_a_fallback_answer_settles_the_calls_budget_hold(setup, deployed):
    """The hold made at admission goes with the call: the failed primary attempt's row
    takes an id of its own, the fallback's row carries the hold's and settles it, so the
    budget shows the fallback's cost spent and nothing left reserved."""
    plane, _, _ = setup
    key, _ = deployed
    made = await plane.admin.put("/v1/budgets", json={"scope": "tenant", "tenant": TENANT, "limit": "100"})
    assert made.status_code in (200, 201), made.text
    try:
        answer = await plane.client(key).post("/v1/completions", headers={"x-request-id": "fb-budget"}, json={
            "model": "primary", "prompt": "Hello", "max_tokens": 4, "ignore_eos": True})
        assert answer.status_code == 200 and answer.headers["x-thawpool-served-by"] == "backup", answer.text
        failed, served = await usage_rows(plane, "fb-budget", 2)
        assert failed.invocation_id != served.invocation_id and served.cost > 0

        async def settled():
            view = (await plane.admin.get(f"/v1/budgets/{made.json()['id']}")).json()
            return view if Decimal(view["reserved"]) == 0 else None
        view = await eventually(settled, timeout_s=30, what="the call's hold settled")
        assert Decimal(view["spent"]) >= served.cost > 0
    finally:
        await plane.admin.delete(f"/v1/budgets/{made.json()['id']}")
