"""Prometheus metrics on a per-app registry, and the middleware that records requests."""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.responses import Response

from wire.request_id import ASGIApp, Message, Receive, Scope, Send

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("thawpool_http_requests_total", "HTTP requests",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram("thawpool_http_request_duration_seconds",
                                 "HTTP request latency", ["route"], buckets=LATENCY_BUCKETS,
                                 registry=r)
        self.ttft = Histogram("thawpool_ttft_seconds", "Gateway time to first token",
                              ["deployment"], buckets=LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("thawpool_tokens_total", "Tokens metered",
                              ["deployment", "direction"], registry=r)
        self.invocations = Counter("thawpool_invocations_total", "Gateway invocations",
                                   ["deployment", "status"], registry=r)
        self.usage_write_lag = Histogram("thawpool_usage_write_lag_seconds",
                                         "Usage event creation to commit",
                                         buckets=LATENCY_BUCKETS, registry=r)
        self.usage_written = Counter("thawpool_usage_events_written_total",
                                     "Usage events committed to Postgres", registry=r)
        self.usage_pending = Gauge("thawpool_usage_events_pending",
                                   "Usage events in memory, not yet committed", registry=r)
        self.outbox_depth = Gauge("thawpool_usage_outbox_depth",
                                  "Usage events waiting in the durable outbox", registry=r)

    def render(self) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class MetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]

        async def record_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(route, scope["method"], str(status[0])).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - started)
