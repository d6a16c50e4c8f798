"""X-Request-Id: echoed on every response, generated when absent, the engine's id, deduped."""
from __future__ import annotations

import asyncio

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
        assert len(generated.headers["x-request-id"]) >= 16, path


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
    body = {"prompt": "hi", "max_tokens": 24, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as c:
        replies = await asyncio.gather(*[
            c.post("/v1/completions", json=body, headers={"X-Request-Id": "dup"})
            for _ in range(3)])
    assert [r.status_code for r in replies] == [200] * 3
    assert all(r.headers["x-request-id"] == "dup" for r in replies)
    ids = {r.json()["id"] for r in replies}
    assert "cmpl-dup" in ids and len(ids) == 3
    assert all(r.json()["usage"]["completion_tokens"] == 24 for r in replies)
