"""X-Request-Id: echoed on every response, generated when absent, the engine's id, deduped."""
from __future__ import annotations

import asyncio
import re

import httpx


def test_client_id_is_echoed_and_used_as_the_completion_id(client):
    resp = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                       headers={"X-Request-Id": "req-42"})
    assert resp.headers["x-request-id"] == "req-42"
    assert resp.json()["id"] == "cmpl-req-42"


def test_every_endpoint_echoes_or_generates_an_id(client):
    for method, path in [("GET", "/health"), ("GET", "/metrics"), ("GET", "/v1/models"),
                         ("POST", "/v1/completions")]:
        resp = client.request(method, path, json={"prompt": "x", "max_tokens": 0}
                              if method == "POST" else None, headers={"X-Request-Id": "e-1"})
        assert resp.headers["x-request-id"] == "e-1", path
        generated = client.request(method, path, json={"bad": 1} if method == "POST" else None)
        other = client.request(method, path, json={"bad": 1} if method == "POST" else None)
        made = generated.headers["x-request-id"], other.headers["x-request-id"]
        assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in made), (path, made)   # uuid4 hex
        assert made[0] != made[1], path


def test_streams_echo_the_id(client):
    with client.stream("POST", "/v1/chat/completions", headers={"X-Request-Id": "s-1"},
                       json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
                             "stream": True}) as resp:
        assert resp.headers["x-request-id"] == "s-1"
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in resp.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert '"id":"chatcmpl-s-1"' in lines[0]


async def test_colliding_ids_in_flight_get_distinct_engine_ids(server):
    """The first "dup" is known to be in flight (its stream has started, 480 tokens to go,
    about half a second on the tiny model) when two more "dup"s arrive together, each long
    enough (200 tokens) to still run when the other is added. Sent blindly at once, the
    three could run one after another on a fast machine, where reusing the id is right."""
    body = {"prompt": "hi", "ignore_eos": True}
    dup = {"X-Request-Id": "dup"}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as c:
        async with c.stream("POST", "/v1/completions", headers=dup,
                            json={**body, "max_tokens": 480, "stream": True}) as first:
            lines = first.aiter_lines()
            head = await anext(lines)
            assert head.startswith("data: ") and '"id":"cmpl-dup"' in head, head
            replies = await asyncio.gather(*[
                c.post("/v1/completions", json={**body, "max_tokens": 200}, headers=dup)
                for _ in range(2)])
            rest = [line async for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]", "the first ran to its end alongside the others"
    assert first.headers["x-request-id"] == "dup"
    assert [r.status_code for r in replies] == [200] * 2
    assert all(r.headers["x-request-id"] == "dup" for r in replies)
    ids = ["cmpl-dup"] + [r.json()["id"] for r in replies]
    assert len(set(ids)) == 3 and all(i.startswith("cmpl-dup") for i in ids), ids
    assert all(r.json()["usage"]["completion_tokens"] == 200 for r in replies)
