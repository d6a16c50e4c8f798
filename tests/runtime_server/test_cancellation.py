"""A client that goes away: the engine request is aborted and its KV blocks are freed.

The tiny model makes a token in about a millisecond, so "the client left before the
request finished" must not depend on the machine's speed: the server process is frozen
(SIGSTOP) while the client goes, and thawed (SIGCONT) once it has gone, and its engine
core with it.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import httpx

from tests.runtime_server.metrics_text import scrape
from tests.support.waiting import eventually_sync

ABORTS = 'thawpool_request_success_total{finished_reason="abort"}'
LENGTH = 'thawpool_request_success_total{finished_reason="length"}'
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


@contextlib.contextmanager
def frozen(server):
    """The replica stopped for the duration of the block, resumed whatever happens: its
    engine core first, then the server; thawed the other way round, so the server is
    running again before the core steps on."""
    core = httpx.get(f"{server.base_url}/health", timeout=10).json()["engine_core"]
    pids = [core["pid"], server.process.pid]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in reversed(pids):
            os.kill(pid, signal.SIGCONT)


def assert_aborted_once(before: dict, after: dict, max_tokens: int) -> None:
    assert after.get(ABORTS, 0) == before.get(ABORTS, 0) + 1
    assert after.get(LENGTH, 0) == before.get(LENGTH, 0), "it did not run to max_tokens"
    generated = after["thawpool_generation_tokens_total"] - before["thawpool_generation_tokens_total"]
    assert 1 <= generated < max_tokens


def test_closing_a_stream_aborts_and_frees_blocks(server):
    before = wait_idle(server.base_url)
    blocks_total = before["thawpool_kv_cache_blocks_total"]
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as resp:
            lines = resp.iter_lines()
            assert next(lines).startswith("data: ")
            busy = scrape(server.base_url)
            assert busy["thawpool_num_requests_running"] == 1
            with frozen(server):
                resp.close()             # the client goes while the server cannot finish
    after = wait_idle(server.base_url)
    assert_aborted_once(before, after, LONG["max_tokens"])
    # while it ran it held at least its prompt's blocks, at most what prompt + 400 tokens fill
    prompt = after["thawpool_prompt_tokens_total"] - before["thawpool_prompt_tokens_total"]
    least, most = -(-prompt // 16), -(-(prompt + LONG["max_tokens"]) // 16)
    assert least / blocks_total <= busy["thawpool_kv_cache_usage_perc"] <= most / blocks_total


def test_a_non_streaming_client_that_times_out_is_aborted(server):
    before = wait_idle(server.base_url)
    outcome = []

    def call():
        with httpx.Client(base_url=server.base_url, timeout=httpx.Timeout(60, read=1.0)) as c:
            try:
                c.post("/v1/completions", json={**LONG, "max_tokens": 480})
                outcome.append("finished")
            except httpx.ReadTimeout:
                outcome.append("timed out")

    client = threading.Thread(target=call)
    client.start()
    eventually_sync(lambda: scrape(server.base_url)["thawpool_num_requests_running"] == 1,
                    timeout_s=30, what="the request running in the engine")
    with frozen(server):         # the client's read timeout passes meanwhile
        client.join(timeout=30)
    assert not client.is_alive() and outcome == ["timed out"]
    after = wait_idle(server.base_url)
    assert_aborted_once(before, after, 480)


def test_replica_serves_normally_after_aborts(client):
    resp = client.post("/v1/completions", json={**LONG, "max_tokens": 4})
    assert resp.status_code == 200
    assert resp.json()["usage"]["completion_tokens"] == 4
