"""The OpenAI-compatible gateway end to end: a real runtime replica, real Postgres and S3."""
import asyncio
import json
from decimal import Decimal

import httpx
import openai
import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.models import UsageEvent
from controlplane.pricing import Pricing, token_cost
from controlplane.traffic import choose
from pool.api import ColdStartTimeout, QueueFull
from tests.controlplane.conftest import make_settings, running_control_plane
from tests.controlplane.support.static_pool import StaticPool

pytestmark = pytest.mark.asyncio(loop_scope="session")
PRICING = {"input_per_mtok": "2", "cached_input_per_mtok": "1", "output_per_mtok": "4"}
MESSAGES = [{"role": "user", "content": "Hello, how are you today?"}]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def pool(runtime_replica):
    return StaticPool([runtime_replica.base_url])


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory, pool):
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-gw"),
                             max_body_bytes=64_000)
    async with running_control_plane(settings, pool=pool) as plane:
        yield plane


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def tenant(plane, model_uri):
    key = await plane.tenant_key("gw")
    client = plane.client(key)
    response = await client.post("/v1/deployments", json={
        "name": "chat", "model_uri": model_uri, "pricing": PRICING})
    assert response.status_code == 201, response.text
    return key


async def usage_row(plane, request_id: str) -> UsageEvent:
    await plane.flush_usage()
    async with plane.app.state.sessions() as session:
        rows = list(await session.scalars(select(UsageEvent).where(
            UsageEvent.request_id == request_id)))
    assert len(rows) == 1, f"{len(rows)} usage rows for {request_id}"
    return rows[0]


def expected_cost(row) -> Decimal:
    return token_cost(Pricing(Decimal(2), Decimal(1), Decimal(4)), row.prompt_tokens,
                      row.cached_tokens, row.completion_tokens)


async def test_chat_completion_is_forwarded_and_metered(plane, tenant, pool):
    client = plane.client(tenant)
    response = await client.post("/v1/chat/completions", headers={"x-request-id": "req-unary-1"},
                                 json={"model": "chat", "messages": MESSAGES, "max_tokens": 7,
                                       "ignore_eos": True})
    assert response.status_code == 200, response.text
    assert response.headers["x-request-id"] == "req-unary-1"
    body = response.json()
    assert body["model"] == "chat"
    assert "req-unary-1" in body["id"], "the request id reached the runtime"
    assert body["usage"]["completion_tokens"] == 7
    assert "cached_tokens" in body["usage"]["prompt_tokens_details"]
    row = await usage_row(plane, "req-unary-1")
    assert (row.status, row.http_status, row.revision_name) == ("ok", 200, "r1")
    assert row.prompt_tokens == body["usage"]["prompt_tokens"]
    assert row.completion_tokens == 7 and row.cost == expected_cost(row) > 0
    call = next(c for c in pool.calls if c.request_id == "req-unary-1")
    assert call.lease.released == 1 and call.prompt_tokens > 0 and call.prefix_key


async def test_stream_without_usage_strips_it_and_still_bills(plane, tenant):
    client = plane.client(tenant)
    events = []
    async with client.stream("POST", "/v1/chat/completions", headers={"x-request-id": "req-s-1"},
                             json={"model": "chat", "messages": MESSAGES, "max_tokens": 6,
                                   "ignore_eos": True, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("usage" not in c and c["model"] == "chat" for c in chunks)
    assert all(c["choices"] for c in chunks)
    row = await usage_row(plane, "req-s-1")
    assert row.status == "ok" and row.completion_tokens == 6 and row.ttft_s is not None


async def test_stream_with_include_usage_ends_with_a_usage_chunk(plane, tenant):
    client = plane.client(tenant)
    chunks = []
    async with client.stream("POST", "/v1/completions", headers={"x-request-id": "req-s-2"},
                             json={"model": "chat", "prompt": "The quick brown fox",
                                   "max_tokens": 5, "ignore_eos": True, "stream": True,
                                   "stream_options": {"include_usage": True}}) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    final = chunks[-1]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 5
    assert all(c["usage"] is None for c in chunks[:-1])
    row = await usage_row(plane, "req-s-2")
    assert row.endpoint == "completions" and row.completion_tokens == 5
    assert row.prompt_tokens == final["usage"]["prompt_tokens"]


async def replica_metric(replica, name: str) -> float:
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{replica.base_url}/metrics")).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


async def test_a_stream_cut_midway_is_billed_as_partial(plane, tenant, runtime_replica):
    client = plane.client(tenant)
    generated_before = await replica_metric(runtime_replica, "thawpool_generation_tokens_total")
    received = 0
    async with client.stream("POST", "/v1/chat/completions", headers={"x-request-id": "req-cut"},
                             json={"model": "chat", "messages": MESSAGES, "max_tokens": 400,
                                   "ignore_eos": True, "stream": True}) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                received += 1
                if received == 3:
                    break                     # leaving the block closes the connection
    while True:                               # the row is written once the gateway notices
        await plane.flush_usage()
        async with plane.app.state.sessions() as session:
            row = await session.scalar(select(UsageEvent).where(UsageEvent.request_id == "req-cut"))
        if row is not None:
            break
        await asyncio.sleep(0.05)
    assert row.status == "partial" and row.http_status == 499
    assert 3 <= row.completion_tokens < 400
    assert row.cost == expected_cost(row)
    while await replica_metric(runtime_replica, "thawpool_num_requests_running"):
        await asyncio.sleep(0.05)
    generated = await replica_metric(runtime_replica, "thawpool_generation_tokens_total")
    assert generated - generated_before < 400, "the replica aborted the request"


async def test_the_openai_client_works_unchanged(plane, tenant):
    client = openai.AsyncOpenAI(base_url=f"{plane.base_url}/v1", api_key=tenant, max_retries=0)
    try:
        chat = await client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=4)
        assert chat.model == "chat" and chat.usage.completion_tokens <= 4
        assert chat.choices[0].message.role == "assistant"
        text = await client.completions.create(model="chat", prompt="Hello", max_tokens=3)
        assert text.usage.prompt_tokens > 0
        stream = await client.chat.completions.create(
            model="chat", messages=MESSAGES, max_tokens=5, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        pieces, usage = [], None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            if chunk.usage:
                usage = chunk.usage
        assert pieces and usage.completion_tokens == 5
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="nope", messages=MESSAGES)
    finally:
        await client.close()


async def test_gateway_4xx(plane, tenant):
    client = plane.client(tenant)
    cases = [
        ({"model": "missing", "messages": MESSAGES}, 404),
        ({"messages": MESSAGES}, 400),
        ({"model": "chat"}, 400),
        ({"model": "chat", "prompt": "x"}, 400),            # chat needs messages
        ({"model": "chat", "messages": MESSAGES, "temperature": -1}, 400),   # the replica's check
    ]
    for body, status in cases:
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == status, (body, response.text)
        assert set(response.json()["error"]) >= {"type", "message", "code"}
    replica_refusal = await client.post("/v1/chat/completions", json=cases[-1][0])
    assert replica_refusal.json()["error"]["param"] == "temperature"
    broken = await client.post("/v1/completions", content=b"{",
                               headers={"content-type": "application/json"})
    assert broken.status_code == 400
    huge = await client.post("/v1/completions",
                             json={"model": "chat", "prompt": "x" * 100_000})
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "body_too_large"
    assert (await plane.client().post("/v1/completions", json={})).status_code == 401
    no_invoke = plane.client(await plane.tenant_key("gw", scopes=["billing:read"]))
    assert (await no_invoke.post("/v1/completions", json={})).status_code == 403


async def test_pool_errors_map_to_status_and_retry_after(plane, tenant, pool):
    client = plane.client(tenant)
    body = {"model": "chat", "messages": MESSAGES, "max_tokens": 2}
    try:
        pool.refuse_with = QueueFull("activator queue is full", retry_after_s=2.5)
        full = await client.post("/v1/chat/completions", json=body)
        assert full.status_code == 429 and full.headers["retry-after"] == "3"
        assert full.json()["error"]["code"] == "queue_full"
        pool.refuse_with = ColdStartTimeout("still loading", retry_after_s=7)
        cold = await client.post("/v1/chat/completions", json=body)
        assert cold.status_code == 503 and cold.headers["retry-after"] == "7"
    finally:
        pool.refuse_with = None


async def test_rate_limits_answer_429_with_retry_after(plane, model_uri):
    await plane.tenant_key("limited")
    admin = plane.admin
    rpm = (await admin.post("/v1/tenants/limited/keys",
                            json={"scopes": ["invoke", "deploy"], "requests_per_min": 2})).json()["key"]
    tpm = (await admin.post("/v1/tenants/limited/keys",
                            json={"scopes": ["invoke"], "tokens_per_min": 40})).json()["key"]
    deployer = plane.client(rpm)
    await deployer.post("/v1/deployments", json={"name": "lim", "model_uri": model_uri})
    body = {"model": "lim", "prompt": "Hi", "max_tokens": 2}
    assert (await deployer.post("/v1/completions", json=body)).status_code == 200
    assert (await deployer.post("/v1/completions", json=body)).status_code == 200
    limited = await deployer.post("/v1/completions", json=body)
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    assert limited.json()["error"]["code"] == "requests_per_min"
    tokens = plane.client(tpm)
    assert (await tokens.post("/v1/completions", json={**body, "max_tokens": 30})).status_code == 200
    refused = await tokens.post("/v1/completions", json={**body, "max_tokens": 30})
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "tokens_per_min"


async def test_canary_split_sticks_by_request_id_and_is_recorded(plane, tenant, model_uri):
    client = plane.client(tenant)
    await client.post("/v1/deployments", json={"name": "canary", "model_uri": model_uri})
    await client.patch("/v1/deployments/canary", json={"engine": {"seed": 3}, "promote": False})
    await client.post("/v1/deployments/canary/traffic", json={"r1": 50, "r2": 50})
    seen = {}
    for i in range(8):
        request_id = f"canary-{i}"
        response = await client.post("/v1/completions", headers={"x-request-id": request_id},
                                     json={"model": "canary", "prompt": "Hi", "max_tokens": 1})
        seen[request_id] = response.headers["x-thawpool-revision"]
        assert seen[request_id] == choose({"r1": 50, "r2": 50}, request_id)
    assert set(seen.values()) == {"r1", "r2"}
    again = await client.post("/v1/completions", headers={"x-request-id": "canary-0"},
                              json={"model": "canary", "prompt": "Hi", "max_tokens": 1})
    assert again.headers["x-thawpool-revision"] == seen["canary-0"]
    await plane.flush_usage()
    async with plane.app.state.sessions() as session:
        rows = list(await session.scalars(select(UsageEvent).where(
            UsageEvent.deployment_name == "canary", UsageEvent.request_id != "canary-0")))
    assert {r.request_id: r.revision_name for r in rows} == \
        {k: v for k, v in seen.items() if k != "canary-0"}


async def test_tenants_cannot_invoke_or_bill_each_other(plane, tenant, model_uri):
    other = plane.client(await plane.tenant_key("gw-other"))
    refused = await other.post("/v1/chat/completions", json={"model": "chat", "messages": MESSAGES})
    assert refused.status_code == 404
    mine = await plane.client(tenant).post("/v1/completions", headers={"x-request-id": "iso-1"},
                                           json={"model": "chat", "prompt": "Hi", "max_tokens": 2})
    assert mine.status_code == 200
    await plane.flush_usage()
    theirs = (await other.get("/v1/billing/report", params={"group_by": "deployment"})).json()
    assert theirs["rows"] == [] and theirs["totals"]["requests"] == 0
    own = (await plane.client(tenant).get("/v1/billing/report",
                                          params={"group_by": "deployment"})).json()
    assert own["totals"]["requests"] >= 1
    metrics = (await plane.client().get("/metrics")).text
    assert 'thawpool_tokens_total{deployment="chat",direction="out"}' in metrics
    assert "# TYPE thawpool_ttft_seconds histogram" in metrics
