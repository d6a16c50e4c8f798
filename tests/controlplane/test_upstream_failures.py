"""What the client gets and what is billed when the replica fails (a replica that fails
on purpose, behind the real gateway, Postgres and S3).

Non-streaming: a 502 in the error shape and an `error` row with the tokens delivered
(none). Streaming: what was delivered, the replica's error event, no [DONE], and a
`partial` row billed for the tokens delivered."""
import asyncio
import json

import pytest
import pytest_asyncio
from sqlalchemy import select
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from controlplane.models import UsageEvent
from tests.controlplane.conftest import make_settings, running_control_plane
from tests.controlplane.support.servers import serve
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


ANSWER_CAP = 1 << 20


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
    app = Starlette(routes=[Route("/v1/completions", broken_replica, methods=["POST"])])
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
