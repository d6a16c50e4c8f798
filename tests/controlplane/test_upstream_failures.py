"""What the client gets and what is billed when the replica fails (a replica that fails
on purpose, behind the real gateway, Postgres and S3).

Non-streaming: a 502 in the error shape and an `error` row with the tokens delivered
(none). Streaming: what was delivered, the replica's error event, no [DONE], and a
`partial` row billed for the tokens delivered."""
import asyncio
import json
import math
import time
import zlib
from pathlib import Path

import pytest
import pytest_asyncio
from sqlalchemy import select
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from controlplane.gateway.llm import context_length
from controlplane.store.tables import Revision, StoredResponse, UsageEvent
from tests.controlplane.conftest import make_settings, running_control_plane
from tests.controlplane.support.servers import serve
from tests.functions.test_function_deploy import upload
from tests.support.waiting import eventually
from wire.errors import error_body
from wire.sse import sse

pytestmark = pytest.mark.asyncio(loop_scope="session")


def chunk(tokens: int) -> dict:
    return {"id": "cmpl-x", "object": "text_completion", "model": "m",
            "choices": [{"index": 0, "text": "a", "finish_reason": None}],
            "usage": {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": 3 + tokens}}


async def broken_replica(request: Request):
    """`prompt` says how it fails: `die` (the engine died: a 500, or an error event
    mid-stream), `cut` (the connection drops mid-answer); `done-slow` does not fail: it
    sends the whole answer and [DONE], then holds the stream open a while."""
    body = await request.json()
    how, stream = body["prompt"], body.get("stream", False)
    if how == "ok" and not stream:
        return JSONResponse(chunk(2))
    if how == "garbled" and stream:     # one event, then a line that is not JSON
        return Response(sse(chunk(1)) + b"data: {\"choices\": [\n\n",
                        media_type="text/event-stream")
    if how == "nan" and not stream:    # a logprob no JSON may carry
        answer = chunk(1)
        answer["choices"][0]["logprobs"] = {"token_logprobs": [math.nan]}
        return Response(json.dumps(answer), media_type="application/json")
    if how.startswith("usage:"):        # a usage of the test's choosing, NaN included
        return hostile_usage(json.loads(how[6:]), stream)
    if how == "huge":
        return StreamingResponse(huge_answer(stream), media_type="text/event-stream")
    if how == "die" and not stream:
        return JSONResponse(error_body("the engine died: illegal memory access", 500), 500)

    async def events():
        if how == "done-slow":   # a whole answer, then a slow end of the stream after [DONE]
            yield sse(chunk(1))
            yield sse(chunk(2))
            yield sse("[DONE]")
            await asyncio.sleep(3)
            return
        yield b'{"choices": [' if not stream else sse(chunk(1))
        if stream:
            yield sse(chunk(2))
        if how == "die":
            yield sse(error_body("the engine died: illegal memory access", 500))
            return
        raise RuntimeError("the replica process is gone")

    return StreamingResponse(events(), media_type="text/event-stream" if stream else "application/json")


def chat_chunk(tokens: int) -> dict:
    return {"id": "chatcmpl-x", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}],
            "usage": {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": 3 + tokens}}


async def broken_chat(request: Request):
    """The last message says how it fails, as `broken_replica`'s prompt does (`die`, `cut`):
    what a Responses API call is served by."""
    body = await request.json()
    how = body["messages"][-1]["content"]
    if not body.get("stream"):
        return JSONResponse(error_body("the engine died: illegal memory access", 500), 500)

    async def events():
        yield sse(chat_chunk(1))
        yield sse(chat_chunk(2))
        if how == "die":
            yield sse(error_body("the engine died: illegal memory access", 500))
            return
        raise RuntimeError("the replica process is gone")

    return StreamingResponse(events(), media_type="text/event-stream")


ANSWER_CAP = 1 << 20
PROBE = Path(__file__).resolve().parents[1] / "functions" / "packages" / "probe"


def hostile_usage(usage, stream: bool) -> Response:
    """A whole answer (text "a"), or a stream of three, each carrying `usage` as it is
    (`"missing"`: none at all)."""
    answer = chunk(1)
    if usage == "missing":
        del answer["usage"]
    else:
        answer["usage"] = usage
    if not stream:
        return Response(json.dumps(answer), media_type="application/json")
    events = b"".join(b"data: %s\n\n" % json.dumps(answer).encode() for _ in range(3))
    return Response(events + b"data: [DONE]\n\n", media_type="text/event-stream")


async def hostile_function(request: Request) -> Response:
    """A function's answer whose usage (and outputs, when given) is the JSON the first
    input's `usage` (`outputs`) holds, NaN included, padded with `pad` bytes."""
    body = await request.json()
    inputs = body.get("inputs") or [body["input"]]
    outputs = json.loads(inputs[0].get("outputs", "null")) or [{"ok": True} for _ in inputs]
    answer = {"outputs": outputs, "usage": json.loads(inputs[0]["usage"]),
              "pad": "x" * inputs[0].get("pad", 0)}
    return Response(json.dumps(answer), media_type="application/json")


async def huge_answer(stream: bool):
    """A unary answer, or a stream's line after a first event, with no end (2 GB, were
    it read to the end): past the control plane's caps."""
    if stream:
        yield sse(chunk(1))
    yield b'data: {"choices": ["'
    for _ in range(2 << 14):
        yield b"x" * (1 << 16)
        await asyncio.sleep(0)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    app = Starlette(routes=[Route("/v1/completions", broken_replica, methods=["POST"]),
                            Route("/v1/chat/completions", broken_chat, methods=["POST"]),
                            Route("/invoke", hostile_function, methods=["POST"])])
    async with serve(app) as replica_url:
        settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-up"),
                                 upstream_max_answer_bytes=ANSWER_CAP,
                                 upstream_max_line_bytes=ANSWER_CAP)
        async with running_control_plane(settings, base_urls=[replica_url]) as plane:
            yield plane


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def client(plane, model_uri):
    client = plane.client(await plane.tenant_key("broken"))
    created = await client.post("/v1/deployments", json={"name": "chat", "model_uri": model_uri})
    assert created.status_code == 201, created.text
    return client


async def usage_row(plane, request_id: str) -> UsageEvent:
    await plane.flush_usage()
    async with plane.app.state.sessions() as session:
        (row,) = list(await session.scalars(select(UsageEvent).where(
            UsageEvent.request_id == request_id)))
    return row


def lease_of(plane, request_id: str):
    (call,) = [c for c in plane.app.state.pool.calls if c.request_id == request_id]
    return call.lease


@pytest.mark.parametrize("how", ["die", "cut"])
async def test_a_unary_upstream_failure_is_a_502_and_an_error_row(plane, client, how):
    request_id = f"unary-{how}"
    response = await client.post("/v1/completions", headers={"x-request-id": request_id},
                                 json={"model": "chat", "prompt": how, "max_tokens": 5})
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["code"] == "upstream_error" and error["type"]
    assert response.headers["x-request-id"] == request_id
    row = await usage_row(plane, request_id)
    assert (row.status, row.http_status) == ("error", 502)
    assert (row.prompt_tokens, row.completion_tokens, row.cost) == (0, 0, 0)
    lease = lease_of(plane, request_id)
    assert lease.failed and lease.released == 1, "the pool is told to check the replica"


@pytest.mark.parametrize("how, last_event", [
    ("die", "the engine died: illegal memory access"),        # the replica's own error event
    ("cut", "the replica stream ended early")])               # the gateway's
async def test_a_stream_cut_upstream_ends_with_an_error_event_and_bills_partial(
        plane, client, how, last_event):
    request_id = f"stream-{how}"
    async with client.stream("POST", "/v1/completions", headers={"x-request-id": request_id},
                             json={"model": "chat", "prompt": how, "max_tokens": 5,
                                   "stream": True}) as response:
        assert response.status_code == 200
        events = [line[6:] async for line in response.aiter_lines() if line.startswith("data: ")]
    assert "[DONE]" not in events, "a cut answer never looks complete"
    assert [json.loads(e)["choices"][0]["text"] for e in events[:-1]] == ["a", "a"]
    assert json.loads(events[-1])["error"]["message"] == last_event
    row = await usage_row(plane, request_id)
    assert (row.status, row.http_status, row.completion_tokens) == ("partial", 502, 2)
    assert lease_of(plane, request_id).failed


async def test_a_failed_response_is_a_502_stored_nowhere_and_billed_nothing(plane, client):
    response = await client.post("/v1/responses", headers={"x-request-id": "responses-die"},
                                 json={"model": "chat", "input": "die", "max_output_tokens": 5})
    assert response.status_code == 502 and response.json()["error"]["code"] == "upstream_error"
    row = await usage_row(plane, "responses-die")
    assert (row.endpoint, row.status, row.completion_tokens, row.cost) == ("responses", "error", 0, 0)


@pytest.mark.parametrize("how, last_error", [
    ("die", "the engine died: illegal memory access"), ("cut", "the replica stream ended early")])
async def test_a_response_stream_cut_upstream_ends_with_an_error_event_and_bills_partial(
        plane, client, how, last_error):
    request_id = f"responses-stream-{how}"
    async with client.stream("POST", "/v1/responses", headers={"x-request-id": request_id},
                             json={"model": "chat", "input": how, "max_output_tokens": 5,
                                   "stream": True}) as response:
        assert response.status_code == 200
        events = [json.loads(line[6:]) async for line in response.aiter_lines() if line.startswith("data: ")]
    kinds = [event["type"] for event in events]
    assert kinds[-1] == "error" and events[-1]["message"] == last_error
    assert "response.completed" not in kinds and kinds.count("response.output_text.delta") == 2
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    row = await usage_row(plane, request_id)
    assert (row.endpoint, row.status, row.http_status, row.completion_tokens) == ("responses", "partial", 502, 2)
    async with plane.app.state.sessions() as session:
        assert await session.get(StoredResponse, events[0]["response"]["id"]) is None, "a cut answer is not kept"


async def test_a_client_that_hangs_up_right_after_done_is_billed_ok(plane, client):
    # the openai client closes the connection on [DONE] while the gateway still reads the
    # replica's end of the stream: the whole answer was sent, so it is `ok`, not `partial`
    request_id = "stream-done-then-hangup"
    async with client.stream("POST", "/v1/completions", headers={"x-request-id": request_id},
                             json={"model": "chat", "prompt": "done-slow", "max_tokens": 5,
                                   "stream": True}) as response:
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                break                  # and hang up, the stream still open upstream

    async def metered() -> list[UsageEvent]:  # once the gateway has seen the hangup
        await plane.flush_usage()
        async with plane.app.state.sessions() as session:
            return list(await session.scalars(select(UsageEvent).where(
                UsageEvent.request_id == request_id)))
    (row,) = await eventually(metered, timeout_s=30, what="the call's usage row")
    assert (row.status, row.http_status, row.completion_tokens) == ("ok", 200, 2)
    assert not lease_of(plane, request_id).failed


async def test_a_unary_answer_past_the_cap_is_a_named_502_and_the_next_call_is_served(plane, client):
    request_id = "unary-huge"
    response = await client.post("/v1/completions", headers={"x-request-id": request_id},
                                 json={"model": "chat", "prompt": "huge", "max_tokens": 5})
    assert response.status_code == 502, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == "answer_too_large" and str(ANSWER_CAP) in error["message"]
    row = await usage_row(plane, request_id)
    assert (row.status, row.http_status, row.prompt_tokens, row.completion_tokens, row.cost) == \
        ("error", 502, 0, 0, 0)
    assert lease_of(plane, request_id).released == 1
    after = await client.post("/v1/completions", headers={"x-request-id": "after-huge"},
                              json={"model": "chat", "prompt": "ok", "max_tokens": 5})
    assert after.status_code == 200, after.text
    assert (await usage_row(plane, "after-huge")).completion_tokens == 2


async def test_a_stream_line_past_the_cap_ends_the_stream_with_a_named_error(plane, client):
    request_id = "stream-huge"
    async with client.stream("POST", "/v1/completions", headers={"x-request-id": request_id},
                             json={"model": "chat", "prompt": "huge", "max_tokens": 5,
                                   "stream": True}) as response:
        assert response.status_code == 200
        events = [line[6:] async for line in response.aiter_lines() if line.startswith("data: ")]
    assert len(events) == 2 and json.loads(events[0])["choices"][0]["text"] == "a"
    error = json.loads(events[-1])["error"]
    assert error["code"] == "answer_too_large" and error["type"] == "upstream_error"
    row = await usage_row(plane, request_id)
    assert (row.status, row.http_status, row.completion_tokens) == ("partial", 502, 1)
    assert lease_of(plane, request_id).released == 1


async def revision_context(plane, request_id: str) -> int:
    row = await usage_row(plane, request_id)
    async with plane.app.state.sessions() as session:
        return context_length(await session.get(Revision, row.revision_id))


MALFORMED_USAGE = [
    {"prompt_tokens": "3", "completion_tokens": "1"},               # strings
    {"prompt_tokens": -3, "completion_tokens": -1},                 # negative
    {"prompt_tokens": math.nan, "completion_tokens": math.nan},     # NaN
    {"prompt_tokens": 3.5, "completion_tokens": 1e300},             # floats
    {"prompt_tokens": True, "completion_tokens": True},             # booleans
    {"prompt_tokens": 3, "completion_tokens": 1,
     "prompt_tokens_details": {"cached_tokens": -7}},               # a bad detail
    ["prompt_tokens", 3],                                           # not an object
    {},                                                             # counts missing
    "missing",                                                      # no usage at all
]


def call_id(name: str, usage) -> str:
    return f"{name}-{zlib.crc32(json.dumps(usage).encode()):08x}"


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize("usage", MALFORMED_USAGE, ids=lambda u: json.dumps(u)[:40])
async def test_a_malformed_usage_still_bills_the_call_by_the_gateways_counts(plane, client,
                                                                             usage, stream):
    request_id = call_id(f"usage-{stream}", usage)
    prompt = "usage:" + json.dumps(usage)
    response = await client.post("/v1/completions", headers={"x-request-id": request_id},
                                 json={"model": "chat", "prompt": prompt, "max_tokens": 5,
                                       "stream": stream})
    assert response.status_code == 200, response.text
    row = await usage_row(plane, request_id)
    assert (row.status, row.http_status) == ("ok", 200)
    assert row.prompt_tokens == len(prompt) // 4 + 1, "the gateway's estimate of the prompt"
    assert row.completion_tokens == (3 if stream else 1), "chunks delivered, or the text's estimate"
    assert row.cached_tokens == 0
    assert lease_of(plane, request_id).released == 1, "the replica goes back to the pool"


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
async def test_token_counts_past_what_the_request_could_use_are_bounded(plane, client, stream):
    request_id = f"usage-huge-{stream}"
    prompt = "usage:" + json.dumps({"prompt_tokens": 2 ** 70, "completion_tokens": 2 ** 62,
                                    "prompt_tokens_details": {"cached_tokens": 2 ** 63}})
    response = await client.post("/v1/completions", headers={"x-request-id": request_id},
                                 json={"model": "chat", "prompt": prompt, "max_tokens": 5,
                                       "stream": stream})
    assert response.status_code == 200, response.text
    row = await usage_row(plane, request_id)           # not refused by Postgres's BIGINT
    context = await revision_context(plane, request_id)
    assert (row.prompt_tokens, row.completion_tokens, row.cached_tokens) == (context,) * 3
    assert context < 2 ** 31


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def function_client(plane, s3_server, models_bucket):
    client = plane.client(await plane.tenant_key("hostile-fn"))
    created = await client.post("/v1/deployments", json={
        "name": "probe", "kind": "function",
        "model_uri": upload(PROBE, s3_server, models_bucket, "hostile-fn/probe")})
    assert created.status_code == 201, created.text
    return client


@pytest.mark.parametrize("usage", [
    {"items": 10 ** 9, "compute_s": 1e300},
    {"items": -4, "compute_s": -5.0},
    {"items": "many", "compute_s": math.nan},
    {"items": 1.5, "compute_s": math.inf},
    {"items": 2 ** 70, "compute_s": 10 ** 400},
    {"compute_s": "slow"},
    ["items", 3],
    None,
], ids=lambda u: json.dumps(u)[:40])
async def test_a_functions_items_are_counted_by_the_gateway_and_its_seconds_bounded(
        plane, function_client, usage):
    request_id = call_id("fn-usage", usage)
    inputs = [{"usage": json.dumps(usage)}, {"usage": "null"}, {"usage": "null"}]
    started = time.perf_counter()
    response = await function_client.post("/v1/functions/probe/invoke",
                                          headers={"x-request-id": request_id},
                                          json={"inputs": inputs})
    wall_s = time.perf_counter() - started
    assert response.status_code == 200, response.text
    row = await usage_row(plane, request_id)
    assert (row.status, row.items) == ("ok", 3)
    assert 0 <= row.gpu_seconds <= wall_s and math.isfinite(row.gpu_seconds)
    assert response.json()["usage"] == {"items": 3, "gpu_seconds": row.gpu_seconds}
    assert lease_of(plane, request_id).released == 1


async def test_a_functions_answer_past_the_cap_is_a_named_502(plane, function_client):
    request_id = "fn-huge"
    response = await function_client.post("/v1/functions/probe/invoke",
                                          headers={"x-request-id": request_id},
                                          json={"input": {"usage": "{}", "pad": 2 * ANSWER_CAP}})
    assert response.status_code == 502, response.text[:300]
    assert response.json()["error"]["code"] == "answer_too_large"
    row = await usage_row(plane, request_id)
    assert (row.status, row.http_status, row.cost) == ("error", 502, 0)
    assert lease_of(plane, request_id).released == 1


@pytest.mark.parametrize("outputs", ["[NaN]", "[{\"score\": Infinity}]", "[1e999]"])
async def test_a_functions_answer_json_cannot_carry_is_a_502_not_a_500(plane, function_client,
                                                                       outputs):
    request_id = call_id("fn-nan", outputs)
    response = await function_client.post("/v1/functions/probe/invoke",
                                          headers={"x-request-id": request_id},
                                          json={"input": {"usage": "{}", "outputs": outputs}})
    assert response.status_code == 502, response.text
    assert response.json()["error"]["code"] == "upstream_error"
    row = await usage_row(plane, request_id)
    assert (row.status, row.http_status, row.cost) == ("error", 502, 0)
    assert lease_of(plane, request_id).released == 1


async def test_a_unary_answer_json_cannot_carry_is_a_502_not_a_500(plane, client):
    request_id = "unary-nan"
    response = await client.post("/v1/completions", headers={"x-request-id": request_id},
                                 json={"model": "chat", "prompt": "nan", "max_tokens": 5})
    assert response.status_code == 502, response.text
    assert response.json()["error"]["code"] == "upstream_error"
    row = await usage_row(plane, request_id)
    assert (row.status, row.http_status, row.cost) == ("error", 502, 0)
    assert lease_of(plane, request_id).released == 1


async def test_a_stream_line_that_is_not_json_ends_the_stream_with_an_error_event(plane, client):
    request_id = "stream-garbled"
    async with client.stream("POST", "/v1/completions", headers={"x-request-id": request_id},
                             json={"model": "chat", "prompt": "garbled", "max_tokens": 5,
                                   "stream": True}) as response:
        assert response.status_code == 200
        events = [line[6:] async for line in response.aiter_lines() if line.startswith("data: ")]
    assert json.loads(events[0])["choices"][0]["text"] == "a" and len(events) == 2
    assert json.loads(events[1])["error"]["code"] == "upstream_error"
    row = await usage_row(plane, request_id)
    assert (row.status, row.http_status, row.completion_tokens) == ("partial", 502, 1)
    assert lease_of(plane, request_id).released == 1
