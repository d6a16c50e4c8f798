"""/metrics: Prometheus text with every family the pool and dashboards read."""
from __future__ import annotations

from tests.runtime_server.metrics_text import families, scrape

FAMILIES = {
    "thawpool_time_to_first_token_seconds", "thawpool_inter_token_latency_seconds",
    "thawpool_request_queue_time_seconds", "thawpool_e2e_request_latency_seconds",
    "thawpool_request_prefill_time_seconds", "thawpool_request_decode_time_seconds",
    "thawpool_num_requests_running", "thawpool_num_requests_waiting",
    "thawpool_kv_cache_usage_perc", "thawpool_prompt_tokens", "thawpool_generation_tokens",
    "thawpool_prefix_cache_queries", "thawpool_prefix_cache_hits", "thawpool_request_success",
}


def test_metrics_has_every_family(server, client):
    resp = client.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    assert FAMILIES <= families(server.base_url)


def test_a_request_moves_the_counters(server, client):
    prompt = "Serverless GPU pools scale to zero when idle and thaw on the first request."
    before = scrape(server.base_url)
    for _ in range(2):   # the second run of the same prompt hits the prefix cache
        r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 5,
                                                 "ignore_eos": True})
        assert r.status_code == 200
    after = scrape(server.base_url)
    num_prompt = r.json()["usage"]["prompt_tokens"]
    delta = {k: after[k] - before.get(k, 0) for k in after}
    assert delta["thawpool_prompt_tokens_total"] == 2 * num_prompt
    assert delta["thawpool_generation_tokens_total"] == 10
    assert delta['thawpool_request_success_total{finished_reason="length"}'] == 2
    assert delta["thawpool_time_to_first_token_seconds_count"] == 2
    assert delta["thawpool_e2e_request_latency_seconds_count"] == 2
    assert delta["thawpool_inter_token_latency_seconds_count"] == 8
    # queries and hits count prompt tokens: both runs look up their whole prompt, the first
    # finds nothing (this prompt is used nowhere else), the second every whole 16-token
    # block but the one holding the last token, which is always computed
    whole_blocks = (num_prompt - 1) // 16 * 16
    assert whole_blocks >= 16, "the prompt spans at least one whole block"
    assert delta["thawpool_prefix_cache_queries_total"] == 2 * num_prompt
    assert delta["thawpool_prefix_cache_hits_total"] == whole_blocks
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == whole_blocks
    assert after["thawpool_kv_cache_blocks_total"] == 1024 // 16
