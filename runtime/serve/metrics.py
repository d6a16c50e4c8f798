"""Prometheus metrics of one replica, on a registry owned by the app (no global registry).

Request-level figures (TTFT, inter-token latency, queue time, e2e, token
counts, finish reasons) are observed by the server as requests finish.
Engine-level figures (running/waiting, KV usage, prefix-cache counters) are
read at scrape time by a collector from the latest `EngineStats` the engine-core
process sent, so the engine never touches prometheus objects.

`ServerMetrics.served` keeps the same token counts as plain integers: what the
pool reads from /stats (cheaply, as JSON) to reconcile the bill with what the
replica says it served.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from runtime.engine.outputs import EngineStats, RequestMetrics

PREFIX = "thawpool"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Latency buckets in seconds: sub-millisecond CPU steps up to minute-long requests.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class EngineStatsCollector:
    """Exposes the latest EngineStats snapshot; `read` returns None before a model is loaded."""

    def __init__(self, read: Callable[[], Optional[EngineStats]]):
        self._read = read

    def collect(self) -> Iterable[Metric]:
        stats = self._read() or EngineStats()
        yield _gauge("num_requests_running", "Requests being scheduled.", stats.num_running)
        yield _gauge("num_requests_waiting", "Requests waiting to be scheduled.", stats.num_waiting)
        yield _gauge("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1).",
                     stats.kv_usage)
        yield _gauge("kv_cache_blocks_total", "KV-cache blocks in the pool.", stats.kv_blocks_total)
        yield _gauge("model_weight_bytes", "Bytes of the loaded weights (after quantization).",
                     stats.weight_bytes)
        yield _counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                       stats.prefix_cache_queries)
        yield _counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                       stats.prefix_cache_hits)
        yield _counter("num_preemptions", "Sequences preempted for lack of KV blocks.",
                       stats.num_preemptions)
        yield _counter("spec_decode_num_draft_tokens", "Draft tokens proposed.", stats.spec_proposed)
        yield _counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.",
                       stats.spec_accepted)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)


@dataclass
class Served:
    """What the replica served in its life: requests finished (or aborted) and their tokens."""
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ServerMetrics:
    """Every metric family of one replica, on its own registry."""

    def __init__(self, read_stats: Callable[[], Optional[EngineStats]]):
        self.registry = CollectorRegistry(auto_describe=True)
        self._ttft = self._histogram("time_to_first_token_seconds", "Arrival to first token.")
        self._itl = self._histogram("inter_token_latency_seconds",
                                    "Gap between successive tokens of one request.")
        self._queue = self._histogram("request_queue_time_seconds", "Arrival to first scheduled.")
        self._prefill = self._histogram("request_prefill_time_seconds", "Prompt computation.")
        self._decode = self._histogram("request_decode_time_seconds", "First token to finish.")
        self._e2e = self._histogram("e2e_request_latency_seconds", "Arrival to finish.")
        self._prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens processed.",
                                      registry=self.registry)
        self._generation_tokens = Counter(f"{PREFIX}_generation_tokens", "Tokens generated.",
                                          registry=self.registry)
        self._requests = Counter(f"{PREFIX}_request_success", "Finished requests by reason.",
                                 ["finished_reason"], registry=self.registry)
        self.registry.register(EngineStatsCollector(read_stats))
        self.served = Served()

    def _histogram(self, name: str, doc: str) -> Histogram:
        return Histogram(f"{PREFIX}_{name}", doc, buckets=_LATENCY_BUCKETS, registry=self.registry)

    def observe_token_gaps(self, gaps: Iterable[float]) -> None:
        for gap in gaps:
            self._itl.observe(gap)

    def observe_finished(self, finish_reason: str, prompt_tokens: int, completion_tokens: int,
                         metrics: Optional[RequestMetrics]) -> None:
        self._requests.labels(finished_reason=finish_reason).inc()
        self._prompt_tokens.inc(prompt_tokens)
        self._generation_tokens.inc(completion_tokens)
        self.served.requests += 1
        self.served.prompt_tokens += prompt_tokens
        self.served.completion_tokens += completion_tokens
        if metrics is None:   # aborted before the engine reported timings
            return
        self._ttft.observe(metrics.ttft_s)
        self._queue.observe(metrics.queue_s)
        self._prefill.observe(metrics.prefill_s)
        self._decode.observe(metrics.decode_s)
        self._e2e.observe(metrics.e2e_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
