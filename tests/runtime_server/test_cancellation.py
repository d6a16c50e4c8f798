"""A client that goes away: the engine request is aborted and its KV blocks are freed."""
from __future__ import annotations

import time

import httpx

from tests.runtime_server.metrics_text import scrape

ABORTS = 'thawpool_request_success_total{finished_reason="abort"}'
LONG = {"prompt": "Continuous batching lets new requests join", "max_tokens": 400,
        "ignore_eos": True, "temperature": 0}


def wait_idle(base_url: str, timeout_s: float = 60) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = scrape(base_url)
        if m["thawpool_num_requests_running"] == 0 and m["thawpool_kv_cache_usage_perc"] == 0:
            return m
        time.sleep(0.05)
    raise AssertionError(f"replica never went idle: {m}")


def test_closing_a_stream_aborts_and_frees_blocks(server):
    before = wait_idle(server.base_url)
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as resp:
            lines = resp.iter_lines()
            assert next(lines).startswith("data: ")
            busy = scrape(server.base_url)
            assert busy["thawpool_num_requests_running"] == 1
            assert busy["thawpool_kv_cache_usage_perc"] > 0
        # leaving the block closes the connection mid-stream
    after = wait_idle(server.base_url)
    assert after.get(ABORTS, 0) == before.get(ABORTS, 0) + 1
    generated = after["thawpool_generation_tokens_total"] - before["thawpool_generation_tokens_total"]
    assert generated < LONG["max_tokens"]


def test_a_non_streaming_client_that_times_out_is_aborted(server):
    before = wait_idle(server.base_url)
    with httpx.Client(base_url=server.base_url, timeout=httpx.Timeout(60, read=0.3)) as c:
        try:
            c.post("/v1/completions", json={**LONG, "max_tokens": 480})
            raise AssertionError("the request finished before the client gave up")
        except httpx.ReadTimeout:
            pass
    after = wait_idle(server.base_url)
    assert after.get(ABORTS, 0) == before.get(ABORTS, 0) + 1


def test_replica_serves_normally_after_aborts(client):
    resp = client.post("/v1/completions", json={**LONG, "max_tokens": 4})
    assert resp.status_code == 200
    assert resp.json()["usage"]["completion_tokens"] == 4
