"""--standby: a warm process with no model; /admin/load loads one in the background.

The standby has a secret, as under the pool; `standby_client` sends it. /health is open,
but without the secret it says only the status: what failed, what loads and how long it
took are the pool's to read."""
from __future__ import annotations

import time

import httpx


def stranger_health(standby) -> tuple[int, dict]:
    """/health as anyone who can reach the port sees it: no secret."""
    health = httpx.get(f"{standby.base_url}/health", timeout=10)
    return health.status_code, health.json()


def test_standby_load_failed_then_ready(standby, standby_client, tiny_model, tmp_path):
    c = standby_client
    health = c.get("/health")
    assert (health.status_code, health.json()) == (503, {"status": "standby"})
    refused = c.post("/v1/completions", json={"prompt": "hi"})
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"

    for bad, param in [({"model": str(tiny_model), "weights": 1}, "weights"),
                       ({"engine": {}}, "model"),
                       ({"model": str(tiny_model), "engine": {"warp_drive": 1}}, "engine")]:
        resp = c.post("/admin/load", json=bad)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param

    # A folder with no model fails the load; the replica says why and may try again.
    assert c.post("/admin/load", json={"model": str(tmp_path)}).status_code == 202
    failed = standby.wait_health({"failed"})
    assert "config.json" in failed["error"]
    assert c.get("/health").status_code == 500
    assert stranger_health(standby) == (500, {"status": "failed"})

    load = {"model": str(tiny_model), "served_model_name": "warm-one",
            "engine": {"kv_cache_tokens": 512, "block_size": 16}}
    load_started = time.monotonic()
    accepted = c.post("/admin/load", json=load)
    assert accepted.status_code == 202
    assert accepted.json() == {"status": "loading", "model": "warm-one"}
    ready = standby.wait_health({"ready"})
    load_wall_s = time.monotonic() - load_started
    assert ready["model"] == "warm-one"
    timings = ready["load_timings"]
    # the load took some time, all of it between our POST and the ready answer, and
    # reading the weights was one part of it
    assert 0 < timings["total_s"] <= load_wall_s
    assert 0 < timings["weights_s"] <= timings["total_s"]
    # the server parsed its tokenizer beside the core's load: only what was left is a stage
    assert 0 <= timings["tokenizer_s"] <= timings["total_s"]
    assert c.get("/health").status_code == 200
    assert stranger_health(standby) == (200, {"status": "ready"})

    again = c.post("/admin/load", json=load)
    assert again.status_code == 409

    done = c.post("/v1/completions", json={"model": "warm-one", "prompt": "hi",
                                           "max_tokens": 3, "ignore_eos": True})
    assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 3
    assert "thawpool_kv_cache_blocks_total 32.0" in c.get("/metrics").text
