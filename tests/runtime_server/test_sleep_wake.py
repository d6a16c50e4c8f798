"""A real replica process put to sleep and woken over HTTP (runtime/core/sleep_mode.py): it
refuses requests while asleep, frees its KV cache and prefix cache, and answers the same
greedy tokens once awake; sleep and wake need the replica's secret like its other routes."""
from __future__ import annotations

import httpx
import pytest

from tests.runtime_server.conftest import start_server

SECRET = "test-sleep-secret-0123456789"
# longer than two KV blocks of 16 tokens, so a repeat of it hits the prefix cache
PROMPT = "the quick brown fox jumps over the lazy dog " * 4
GREEDY = {"model": "sleepy", "prompt": PROMPT, "max_tokens": 12, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def sleepy(tiny_model, tmp_path_factory):
    proc = start_server(["--model", str(tiny_model), "--served-model-name", "sleepy",
                         "--kv-cache-tokens", "512", "--block-size", "16"],
                        tmp_path_factory.mktemp("sleepy") / "server.log",
                        env={"THAWPOOL_REPLICA_SECRET": SECRET})
    try:
        proc.wait_health({"ready"})
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def client(sleepy):
    with httpx.Client(base_url=sleepy.base_url, timeout=60,
                      headers={"Authorization": f"Bearer {SECRET}"}) as c:
        yield c


def test_sleep_refuses_requests_frees_the_caches_and_wake_answers_the_same_tokens(sleepy, client):
    before = client.post("/v1/completions", json=GREEDY).json()
    cached = client.post("/v1/completions", json=GREEDY).json()
    assert cached["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, "the prompt is in the prefix cache"

    assert httpx.post(f"{sleepy.base_url}/sleep").status_code == 401        # the secret is required
    asleep = client.post("/sleep")
    assert asleep.status_code == 200, asleep.text
    body = asleep.json()
    assert body["status"] == "sleeping"
    # tokens * (k, v) * layers * kv heads * head dim * fp32
    assert body["freed_bytes"]["kv_cache"] == 512 * 2 * 2 * 2 * 16 * 4
    assert body["freed_bytes"]["weights"] == 0, "on the CPU the weights stay where they are"
    assert body["host_bytes"] > 0 and body["freed_bytes"]["total"] == body["freed_bytes"]["kv_cache"]

    health = httpx.get(f"{sleepy.base_url}/health")
    assert (health.status_code, health.json()["status"]) == (503, "sleeping")
    refused = client.post("/v1/completions", json=GREEDY)
    assert refused.status_code == 503 and "sleeping" in refused.json()["error"]["message"]
    assert refused.headers["retry-after"] == "1"
    assert client.get("/v1/models").json()["data"] == [], "a sleeper lists no model: the pool adopts none"
    assert client.post("/sleep").status_code == 409

    assert httpx.post(f"{sleepy.base_url}/wake").status_code == 401
    woken = client.post("/wake")
    assert woken.status_code == 200, woken.text
    timings = woken.json()["wake_timings"]
    assert {"weights_s", "kv_cache_s", "other_s", "total_s"} <= set(timings)
    assert timings["total_s"] >= timings["kv_cache_s"]
    assert client.post("/wake").status_code == 409

    after = client.post("/v1/completions", json=GREEDY).json()
    assert after["choices"][0]["text"] == before["choices"][0]["text"]
    assert after["usage"]["completion_tokens"] == before["usage"]["completion_tokens"] == 12
    assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, "the prefix cache was dropped"
    assert httpx.get(f"{sleepy.base_url}/health").json()["status"] == "ready"


def test_a_replica_with_a_request_in_flight_refuses_to_sleep(client):
    streaming = {**GREEDY, "max_tokens": 400, "stream": True}
    with client.stream("POST", "/v1/completions", json=streaming) as stream:
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))   # it is generating
        refused = client.post("/sleep")
        assert refused.status_code == 409 and "in flight" in refused.json()["error"]["message"]
    assert client.post("/v1/completions", json=GREEDY).status_code == 200   # still serving
