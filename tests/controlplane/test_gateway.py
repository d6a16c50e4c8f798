"""The OpenAI-compatible gateway end to end: a real runtime replica, real Postgres and S3."""
import asyncio
import json
import os
import signal
from decimal import Decimal

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families
import pytest
import pytest_asyncio
from sqlalchemy import select

from controlplane.store.tables import UsageEvent
from controlplane.billing.pricing import Pricing, token_cost
from controlplane.deploy.traffic import choose
from pool.api import ColdStartTimeout, QueueFull
from controlplane.app import create_metrics_app
from tests.controlplane.conftest import (METRICS_TOKEN, make_settings, running_control_plane,
                                         started_static_pool)
from tests.controlplane.support.servers import serve
from tests.support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")
PRICING = {"input_per_mtok": "2", "cached_input_per_mtok": "1", "output_per_mtok": "4"}
MESSAGES = [{"role": "user", "content": "Hello, how are you today?"}]


@pytest.fixture(scope="module")
def settings(db_url, s3_server, tmp_path_factory):
    return make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-gw"),
                         max_body_bytes=64_000)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def pool(settings, runtime_replica):
    async with started_static_pool(settings, [runtime_replica.base_url]) as pool:
        yield pool


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(settings, pool):
    async with running_control_plane(settings, pool=pool) as plane:
        yield plane


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def tenant(plane, model_uri):
    key = await plane.tenant_key("gw")
    await plane.set_price(tenant="gw", **PRICING)          # the operator's plan for "gw"
    client = plane.client(key)
    response = await client.post("/v1/deployments", json={
        "name": "chat", "model_uri": model_uri})
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


async def test_an_invocation_is_one_access_log_line_with_its_deployment_and_tokens(
        plane, tenant, caplog):
    client = plane.client(tenant)
    with caplog.at_level("INFO", logger="thawpool"):
        response = await client.post("/v1/completions", headers={"x-request-id": "req-log-1"},
                                     json={"model": "chat", "prompt": "Hi", "max_tokens": 3,
                                           "ignore_eos": True})
    assert response.status_code == 200, response.text
    lines = [r for r in caplog.records if getattr(r, "request_id", None) == "req-log-1"]
    assert [(r.name, r.getMessage()) for r in lines] == [("thawpool.access", "request")]
    line = lines[0]
    assert (line.status, line.path, line.deployment, line.revision, line.outcome) == (
        200, "/v1/completions", "chat", "r1", "ok")
    assert line.completion_tokens == 3 and line.prompt_tokens == response.json()["usage"]["prompt_tokens"]
    assert line.invocation_id == (await usage_row(plane, "req-log-1")).invocation_id
    assert line.priority == 0                          # the key's default: interactive


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


REPLICA_ABORTS = 'thawpool_request_success_total{finished_reason="abort"}'
REPLICA_LENGTH = 'thawpool_request_success_total{finished_reason="length"}'


async def test_a_stream_cut_midway_is_billed_as_partial(plane, tenant, runtime_replica):
    """The replica is frozen (SIGSTOP) the moment the client has its third token and stays
    frozen until the gateway has billed the cut stream, so the outcome does not depend on
    how fast the replica runs: it cannot finish the 400 tokens meanwhile."""
    client = plane.client(tenant)
    before = {name: await replica_metric(runtime_replica, name) for name in
              ("thawpool_generation_tokens_total", REPLICA_ABORTS, REPLICA_LENGTH)}
    received, pid, frozen = 0, runtime_replica.process.pid, False
    try:
        async with client.stream("POST", "/v1/chat/completions",
                                 headers={"x-request-id": "req-cut"},
                                 json={"model": "chat", "messages": MESSAGES, "max_tokens": 400,
                                       "ignore_eos": True, "stream": True}) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {") and \
                        json.loads(line[6:])["choices"][0]["delta"].get("content"):
                    received += 1
                    if received == 3:
                        os.kill(pid, signal.SIGSTOP)
                        frozen = True
                        break                 # leaving the block closes the connection
        row = await eventually(lambda: _usage_row_or_none(plane, "req-cut"), timeout_s=30,
                               what="the gateway billing the stream the client cut")
    finally:
        if frozen:
            os.kill(pid, signal.SIGCONT)
    assert row.status == "partial" and row.http_status == 499
    assert row.cost == expected_cost(row)
    await eventually(lambda: _replica_idle(runtime_replica), timeout_s=60,
                     what="the replica dropping the request after the gateway hung up")
    after = {name: await replica_metric(runtime_replica, name) for name in before}
    assert after[REPLICA_ABORTS] - before[REPLICA_ABORTS] == 1, "the replica aborted it"
    assert after[REPLICA_LENGTH] == before[REPLICA_LENGTH], "it did not run to max_tokens"
    generated = after["thawpool_generation_tokens_total"] - \
        before["thawpool_generation_tokens_total"]
    # billed: at least what the client read, at most what the replica made, short of 400
    assert received <= row.completion_tokens <= generated < 400, (row.completion_tokens, generated)


async def _usage_row_or_none(plane, request_id: str):
    await plane.flush_usage()
    async with plane.app.state.sessions() as session:
        return await session.scalar(select(UsageEvent).where(UsageEvent.request_id == request_id))


async def _replica_idle(replica) -> bool:
    return await replica_metric(replica, "thawpool_num_requests_running") == 0


async def test_the_openai_client_works_unchanged(plane, tenant, runtime_replica):
    client = openai.AsyncOpenAI(base_url=f"{plane.base_url}/v1", api_key=tenant, max_retries=0)
    try:
        chat = await client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=4,
                                                    extra_body={"ignore_eos": True})
        assert chat.model == "chat" and chat.usage.completion_tokens == 4
        assert chat.choices[0].finish_reason == "length"
        assert chat.choices[0].message.role == "assistant"
        text = await client.completions.create(model="chat", prompt="Hello", max_tokens=3)
        async with httpx.AsyncClient(base_url=runtime_replica.base_url, timeout=60) as direct:
            want = (await direct.post("/v1/completions",
                                      json={"prompt": "Hello", "max_tokens": 1})).json()
        assert text.usage.prompt_tokens == want["usage"]["prompt_tokens"], \
            "the prompt reaches the replica as the client sent it"
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

    async def undeclared_length():          # chunked: no content-length to refuse up front
        for _ in range(10):
            yield b"x" * 10_000
    chunked = await client.post("/v1/completions", content=undeclared_length(),
                                headers={"content-type": "application/json"})
    assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "body_too_large"
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
    # 2 a minute: the next request is one refill (30 s) away, less the time the two took,
    # rounded up; well under 5 s pass between the first request and this one
    assert limited.status_code == 429 and 25 <= int(limited.headers["retry-after"]) <= 30, \
        limited.headers["retry-after"]
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


async def test_tenants_cannot_invoke_or_bill_each_other(plane, model_uri):
    """Tenant B, holding every tenant scope, is refused every call on tenant A's deployment
    and A's bill; A's own calls on the same names are the control (they succeed), and A's
    deployment is unchanged by B's refused writes."""
    owner = plane.client(await plane.tenant_key("iso-a"))
    other = plane.client(await plane.tenant_key("iso-b"))
    created = await owner.post("/v1/deployments", json={"name": "iso-chat", "model_uri": model_uri})
    assert created.status_code == 201, created.text
    second = await owner.patch("/v1/deployments/iso-chat",     # r2, so rollback has a target
                               json={"engine": {"seed": 5}, "promote": False})
    assert second.status_code == 200, second.text
    before = (await owner.get("/v1/deployments/iso-chat")).json()
    assert [r["name"] for r in before["revisions"]] == ["r1", "r2"]

    invoke = [("POST", "/v1/completions", {"model": "iso-chat", "prompt": "Hi", "max_tokens": 2}),
              ("POST", "/v1/chat/completions", {"model": "iso-chat", "messages": MESSAGES,
                                                "max_tokens": 2})]
    manage = [("GET", "/v1/deployments/iso-chat", None),
              ("PATCH", "/v1/deployments/iso-chat", {"scaling": {"max_replicas": 3}}),
              ("POST", "/v1/deployments/iso-chat/traffic", {"r1": 50, "r2": 50}),
              ("POST", "/v1/deployments/iso-chat/rollback", None),
              ("DELETE", "/v1/deployments/iso-chat", None)]
    for method, path, body in invoke + manage:
        refused = await other.request(method, path, json=body)
        assert refused.status_code == 404, (method, path, refused.text)
        assert "iso-a" not in refused.text
    listed = (await other.get("/v1/deployments")).json()["data"]
    assert "iso-chat" not in [d["name"] for d in listed]
    assert (await other.get("/v1/billing/report", params={"tenant": "iso-a"})).status_code == 403

    for i, (method, path, body) in enumerate(invoke):           # the control: A is served
        mine = await owner.request(method, path, json={**body, "ignore_eos": True},
                                   headers={"x-request-id": f"iso-{i}"})
        assert mine.status_code == 200, mine.text
    after = (await owner.get("/v1/deployments/iso-chat")).json()
    assert (after["traffic"], after["scaling"], after["revisions"]) == \
        (before["traffic"], before["scaling"], before["revisions"]), "B's writes changed nothing"

    await plane.flush_usage()
    theirs = (await other.get("/v1/billing/report", params={"group_by": "deployment"})).json()
    assert theirs["rows"] == [] and theirs["totals"]["requests"] == 0
    own = (await owner.get("/v1/billing/report", params={"group_by": "deployment"})).json()
    assert [(r["key"], r["requests"]) for r in own["rows"]] == [("iso-chat", 2)]
    assert own["totals"]["requests"] == 2 and own["totals"]["completion_tokens"] == 4
    async with plane.app.state.sessions() as session:
        rows = list(await session.scalars(select(UsageEvent).where(
            UsageEvent.deployment_name == "iso-chat")))
    assert sorted(r.request_id for r in rows) == ["iso-0", "iso-1"], "B's refusals billed nothing"


async def test_gateway_metrics_count_tokens_per_deployment(plane, model_uri):
    client = plane.client(await plane.tenant_key("gw-metrics"))
    created = await client.post("/v1/deployments", json={"name": "counted", "model_uri": model_uri})
    assert created.status_code == 201, created.text
    body = {"model": "counted", "prompt": "Hi", "ignore_eos": True}
    unary = await client.post("/v1/completions", json={**body, "max_tokens": 2})
    assert unary.status_code == 200, unary.text
    async with client.stream("POST", "/v1/completions",
                             json={**body, "max_tokens": 3, "stream": True}) as response:
        assert response.status_code == 200
        assert [line async for line in response.aiter_lines() if line][-1] == "data: [DONE]"
    async with serve(create_metrics_app(plane.app.state.metrics)) as internal:
        async with httpx.AsyncClient(base_url=internal) as scraper:
            text = (await scraper.get("/metrics")).text
    samples = {(s.name, frozenset(s.labels.items())): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}

    def counted(name: str, **labels: str) -> float:
        return samples[(name, frozenset({"tenant": "gw-metrics", "deployment": "counted",
                                         **labels}.items()))]

    assert counted("thawpool_tokens_total", direction="out") == 5
    assert counted("thawpool_tokens_total", direction="in") == \
        2 * unary.json()["usage"]["prompt_tokens"]
    assert counted("thawpool_invocations_total", status="ok") == 2
    assert counted("thawpool_ttft_seconds_count") == 1, "streams only"


async def test_public_metrics_do_not_name_other_tenants_deployments(plane, model_uri):
    """The public listener's /metrics needs the metrics token and, even with it, shows only
    the platform's series; the internal listener (the control) does name the deployment."""
    client = plane.client(await plane.tenant_key("gw-private"))
    created = await client.post("/v1/deployments", json={"name": "private-name",
                                                         "model_uri": model_uri})
    assert created.status_code == 201, created.text
    served = await client.post("/v1/completions", json={"model": "private-name", "prompt": "Hi",
                                                        "max_tokens": 1})
    assert served.status_code == 200, served.text
    anonymous = await plane.client().get("/metrics")
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"] == "invalid_metrics_token"
    as_tenant = await client.get("/metrics")          # an API key is not the metrics token
    assert as_tenant.status_code == 401
    scraped = await plane.client(METRICS_TOKEN).get("/metrics")
    assert scraped.status_code == 200 and "thawpool_http_requests_total" in scraped.text
    for text in (anonymous.text, as_tenant.text, scraped.text):
        assert "private-name" not in text and "gw-private" not in text
    async with serve(create_metrics_app(plane.app.state.metrics)) as internal:
        async with httpx.AsyncClient(base_url=internal) as scraper:
            assert 'deployment="private-name"' in (await scraper.get("/metrics")).text


# Refused at the edge with the replica's own rules (wire.requests), the vocabulary
# (512 tokens) and the stream rules checked against what the deploy read from S3.
REFUSED_AT_THE_EDGE = [
    ("chat/completions", {"messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
    ("chat/completions", {"messages": MESSAGES, "top_p": 2}, "top_p"),
    ("chat/completions", {"messages": MESSAGES, "stop_token_ids": [512]}, "stop_token_ids"),
    ("completions", {"prompt": [1, 2, 10_000], "max_tokens": 2}, "prompt"),
    ("completions", {"prompt": "Hi", "stream_options": {"include_usage": True}},
     "stream_options"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                          "tools": [{"type": "function", "function": {"name": "f"}}],
                          "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "tool_choice"),
    # JSON text nested past json's own recursion limit (the module's bodies stop at 64 kB)
    ("chat/completions", {"messages": MESSAGES, "guided_json": "[" * 60_000}, "guided_json"),
    ("chat/completions", {"messages": MESSAGES, "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": "[" * 60_000}}},
     "response_format"),
    ("chat/completions", {"messages": [*MESSAGES, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[" * 60_000}}]}]},
     "messages"),
    # the Responses API: its own fields, and the chat rules' refusals under the client's names
    ("responses", {"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
    ("responses", {"input": "Hi", "top_p": 2}, "top_p"),
    ("responses", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
     "input"),
    ("responses", {"input": "Hi", "text": {"format": {"type": "json_schema", "name": "s",
                                                      "schema": "[" * 60_000}}}, "text.format"),
]


async def test_bad_input_leaves_a_deployment_at_zero(plane, tenant, pool, model_uri):
    client = plane.client(tenant)
    created = await client.post("/v1/deployments", json={"name": "zero", "model_uri": model_uri})
    assert created.status_code == 201, created.text
    revision_id = created.json()["revisions"][0]["id"]

    def acquired() -> list[str]:
        return [c.request_id for c in pool.calls if c.spec.revision_id == revision_id]

    for i, (endpoint, body, param) in enumerate(REFUSED_AT_THE_EDGE):
        response = await client.post(f"/v1/{endpoint}", headers={"x-request-id": f"edge-{i}"},
                                     json={"model": "zero", **body})
        assert response.status_code == 400, (body, response.text)
        assert response.json()["error"]["param"] == param, response.text
    assert acquired() == [], "a refused request thawed nothing"
    await plane.flush_usage()
    async with plane.app.state.sessions() as session:
        rows = list(await session.scalars(select(UsageEvent).where(
            UsageEvent.deployment_name == "zero")))
    assert rows == [], "a refused request is not billed"
    # the same deployment does wake for a good request, and bills it
    ok = await client.post("/v1/completions", headers={"x-request-id": "edge-ok"},
                           json={"model": "zero", "prompt": [1, 2, 511], "max_tokens": 1})
    assert ok.status_code == 200, ok.text
    assert acquired() == ["edge-ok"]
    assert (await usage_row(plane, "edge-ok")).deployment_name == "zero"


async def test_a_chat_without_max_tokens_reserves_what_the_context_leaves(plane, pool, model_uri):
    """While a request waits for a replica, the token bucket holds the prompt estimate plus
    wire's max_tokens rule: a chat without max_tokens may fill the model's context (512
    tokens, read at deploy), so a second such chat does not fit in 600 tokens a minute
    (with the old flat 256 it did). Refused by the pool, the first gives its tokens back."""
    key = await plane.tenant_key("ctx", tokens_per_min=600)
    client = plane.client(key)
    created = await client.post("/v1/deployments", json={"name": "ctx", "model_uri": model_uri})
    assert created.status_code == 201, created.text
    chat = {"model": "ctx", "messages": MESSAGES}
    pool.hold = asyncio.Event()                        # a cold start that takes a while
    try:
        first = asyncio.create_task(client.post("/v1/chat/completions", json=chat))
        await eventually(lambda: pool.waiting == 1, timeout_s=10, what="the first chat waiting")
        second = await client.post("/v1/chat/completions", json=chat)
        assert second.status_code == 429, second.text
        assert second.json()["error"]["code"] == "tokens_per_min"
        pool.refuse_with = QueueFull("activator queue is full")    # the cold start fails
        pool.hold.set()
        assert (await first).json()["error"]["code"] == "queue_full"
        again = await client.post("/v1/chat/completions", json=chat)
        assert again.json()["error"]["code"] == "queue_full", "the refused chat's tokens came back"
    finally:
        pool.hold, pool.refuse_with = None, None


async def test_tokens_are_charged_by_the_real_usage(plane, model_uri):
    """A text prompt is estimated at four characters a token; this one is about one a token
    on the tiny model, so the real usage is charged when it ends, and the next request waits."""
    client = plane.client(await plane.tenant_key("real-usage", tokens_per_min=150))
    created = await client.post("/v1/deployments", json={"name": "dense", "model_uri": model_uri})
    assert created.status_code == 201, created.text
    body = {"model": "dense", "prompt": "#%&" * 40, "max_tokens": 1}    # estimate: 31 + 1
    first = await client.post("/v1/completions", json=body)
    assert first.status_code == 200, first.text
    assert first.json()["usage"]["prompt_tokens"] > 100
    second = await client.post("/v1/completions", json=body)
    assert second.status_code == 429, "without the correction four of these fit a minute"
    assert second.json()["error"]["code"] == "tokens_per_min"


async def test_tenant_limits_count_every_key_of_the_tenant(plane, model_uri):
    owner = plane.client(await plane.tenant_key("whole"))
    created = await owner.post("/v1/deployments", json={"name": "t", "model_uri": model_uri})
    assert created.status_code == 201, created.text
    limited = await plane.admin.patch("/v1/tenants/whole/quota", json={"requests_per_min": 2})
    assert limited.status_code == 200 and limited.json()["limits"]["requests_per_min"] == 2
    other = plane.client(await plane.tenant_key("whole"))
    body = {"model": "t", "prompt": "Hi", "max_tokens": 1}
    assert (await owner.post("/v1/completions", json=body)).status_code == 200
    assert (await other.post("/v1/completions", json=body)).status_code == 200
    refused = await owner.post("/v1/completions", json=body)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "tenant_requests_per_min"
    assert 1 <= int(refused.headers["retry-after"]) <= 30


async def test_the_hot_path_reads_memory_not_postgres(plane, tenant):
    """Auth, the deployment, its revision and traffic, the price and the quota all come
    from memory: an invocation runs no SQL statement (the usage row is written later, off
    the request's path)."""
    from sqlalchemy import event

    statements = []

    def count(conn, cursor, statement, *args):
        statements.append(statement)

    engine = plane.app.state.db_engine.sync_engine
    client = plane.client(tenant)
    body = {"model": "chat", "prompt": "Hi", "max_tokens": 1}
    assert (await client.post("/v1/completions", json=body)).status_code == 200    # warm
    event.listen(engine, "before_cursor_execute", count)
    try:
        for _ in range(3):
            assert (await client.post("/v1/completions", json=body)).status_code == 200
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert statements == []


async def test_a_unary_answer_is_metered_after_its_send_even_a_failed_one():
    """routes/gateway.py:MeteredResponse: the meter runs once the answer was handed to the
    connection, and also when handing it over failed (the client's connection broke): the
    replica's lease is always given back."""
    from starlette.responses import JSONResponse

    from controlplane.routes.gateway import MeteredResponse

    events: list[str] = []

    async def meter() -> None:
        events.append("metered")

    async def send(message) -> None:
        events.append(message["type"])

    async def receive():
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
    await MeteredResponse(JSONResponse({"ok": 1}), meter)(scope, receive, send)
    assert events == ["http.response.start", "http.response.body", "metered"]

    async def broken(message) -> None:
        raise OSError("connection reset by peer")

    events.clear()
    with pytest.raises(OSError):
        await MeteredResponse(JSONResponse({"ok": 1}), meter)(scope, receive, broken)
    assert events == ["metered"]
