"""Prometheus metrics on two per-app registries, and the middleware that records requests.

`platform` holds what names no tenant (HTTP requests by route template, the
usage writer): the public listener serves it to a caller holding the metrics
token. `tenants` holds per-deployment series labelled with tenant and deployment
names: only the internal listener (`settings.metrics_port`, loopback by
default) serves it, with the platform's.
"""
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
        self.tenant_registry = CollectorRegistry()
        r, t = self.registry, self.tenant_registry
        self.requests = Counter("thawpool_http_requests_total", "HTTP requests",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram("thawpool_http_request_duration_seconds",
                                 "HTTP request latency", ["route"], buckets=LATENCY_BUCKETS,
                                 registry=r)
        self.ttft = Histogram("thawpool_ttft_seconds", "Gateway time to first token",
                              ["tenant", "deployment"], buckets=LATENCY_BUCKETS, registry=t)
        self.tokens = Counter("thawpool_tokens_total", "Tokens metered",
                              ["tenant", "deployment", "direction"], registry=t)
        self.invocations = Counter("thawpool_invocations_total", "Gateway invocations",
                                   ["tenant", "deployment", "status"], registry=t)
        self.adapter_loads = Histogram("thawpool_adapter_load_seconds",
                                       "A call's wait for its LoRA adapter's load into a warm replica",
                                       ["tenant", "deployment"], buckets=LATENCY_BUCKETS, registry=t)
        self.usage_write_lag = Histogram("thawpool_usage_write_lag_seconds",
                                         "Usage event creation to commit",
                                         buckets=LATENCY_BUCKETS, registry=r)
        self.usage_written = Counter("thawpool_usage_events_written_total",
                                     "Usage events committed to Postgres", registry=r)
        self.usage_pending = Gauge("thawpool_usage_events_pending",
                                   "Usage events in memory, not yet committed", registry=r)
        self.outbox_depth = Gauge("thawpool_usage_outbox_depth",
                                  "Usage events waiting in the durable outbox", registry=r)
        self.usage_spilled = Counter("thawpool_usage_events_spilled_total",
                                     "Usage events moved from a full memory buffer to the outbox",
                                     registry=r)
        self.usage_dead_letters = Counter(
            "thawpool_usage_dead_letters_total",
            "Usage events Postgres refused for good (or outbox lines that failed their "
            "checksum), moved to the dead-letter file: alert on any", registry=r)

    def render(self, *, with_tenants: bool) -> Response:
        """The platform's series; with the tenants' too for the internal listener."""
        body = generate_latest(self.registry)
        if with_tenants:
            body += generate_latest(self.tenant_registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)


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
