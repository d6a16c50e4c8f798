"""The OpenAI-compatible gateway: authorise, route to a revision, lease a replica, relay, meter."""
from __future__ import annotations

import inspect
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Optional

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from controlplane import deployments as deployments_db
from controlplane import openai_wire as wire
from controlplane.auth import require
from controlplane.bodies import read_json
from controlplane.errors import ApiError
from controlplane.models import Deployment, Revision
from controlplane.pricing import token_cost
from controlplane.ratelimit import RateLimiter
from controlplane.relay import StreamRelay, until_disconnect
from controlplane.tenants import Principal
from controlplane.traffic import choose
from controlplane.usage import UsageRecord
from pool.api import PoolError

log = logging.getLogger("thawpool.gateway")


@dataclass
class Call:
    """One invocation in flight: where it went and what it has used so far."""
    principal: Principal
    deployment: Deployment
    revision: Revision
    request_id: str
    endpoint: str
    lease: object
    started_at: datetime
    t0: float
    usage: wire.UsageSeen = field(default_factory=wire.UsageSeen)
    ttft_s: Optional[float] = None
    finished: bool = False


class Gateway:
    def __init__(self, *, sessions, pool, http: httpx.AsyncClient, writer, metrics, settings,
                 limiter: Optional[RateLimiter] = None, clock=time.monotonic):
        self.sessions = sessions
        self.pool = pool
        self.http = http
        self.writer = writer
        self.metrics = metrics
        self.settings = settings
        self.limiter = limiter or RateLimiter()
        self.clock = clock

    async def invoke(self, request: Request, endpoint: str) -> Response:
        principal = require(request, "invoke")
        request_id = request.state.request_id
        body = await read_json(request, self.settings.max_body_bytes)
        wire.check_request(body, endpoint)
        deployment, revision = await self._route(principal, body["model"], request_id)
        text = wire.prompt_text(body, endpoint)
        self._admit(principal, wire.estimate_prompt_tokens(text)
                    + wire.requested_max_tokens(body, endpoint))
        started_at, t0 = datetime.now(timezone.utc), time.perf_counter()
        lease = await self._acquire(deployment, revision, request_id, text)
        call = Call(principal, deployment, revision, request_id, endpoint, lease, started_at, t0)
        try:
            upstream = await self.http.send(self.http.build_request(
                "POST", f"{lease.base_url.rstrip('/')}/v1/{endpoint}",
                json=wire.upstream_body(body), headers={"x-request-id": request_id}),
                stream=True)
        except httpx.HTTPError as exc:
            lease.mark_failed()
            await self._finish(call, "error", 502)
            raise ApiError(502, f"replica unreachable: {type(exc).__name__}",
                           code="replica_unreachable", retry_after_s=1) from None
        if upstream.status_code != 200 or not body.get("stream"):
            return await self._unary(call, upstream, request)
        return self._stream(call, upstream, wire.client_stream_options(body))

    async def _route(self, principal: Principal, name: str,
                     request_id: str) -> tuple[Deployment, Revision]:
        async with self.sessions() as session:
            deployment = await deployments_db.find(session, principal.tenant_id, name)
            revisions = {r.name: r for r in await deployments_db.revisions_of(session, deployment)}
        return deployment, revisions[choose(deployment.traffic, request_id)]

    def _admit(self, principal: Principal, tokens: int) -> None:
        limited = self.limiter.admit(
            principal.key_id,
            requests_per_min=principal.requests_per_min or self.settings.default_requests_per_min,
            tokens_per_min=principal.tokens_per_min or self.settings.default_tokens_per_min,
            tokens=tokens, now=self.clock())
        if limited is not None:
            raise ApiError(429, f"rate limit exceeded: {limited.limit}", code=limited.limit,
                           retry_after_s=limited.retry_after_s)

    async def _acquire(self, deployment: Deployment, revision: Revision, request_id: str,
                       text: str):
        try:
            return await self.pool.acquire(
                deployments_db.revision_spec(deployment, revision), request_id=request_id,
                prefix_key=wire.prefix_key(text),
                prompt_tokens=wire.estimate_prompt_tokens(text),
                timeout_s=self.settings.acquire_timeout_s)
        except PoolError as exc:
            retry = exc.retry_after_s if exc.retry_after_s is not None else (
                5.0 if exc.status in (429, 503) else None)
            raise ApiError(exc.status, str(exc) or type(exc).__name__,
                           code=_snake(type(exc).__name__), retry_after_s=retry) from None

    async def _unary(self, call: Call, upstream: httpx.Response, request: Request) -> Response:
        try:
            raw = await until_disconnect(request.receive, upstream.aread())
        except httpx.HTTPError:
            raw = None
            call.lease.mark_failed()
        finally:
            await upstream.aclose()
        if raw is None:
            await self._finish(call, "partial", 499)
            return Response(status_code=499)
        try:
            payload = httpx.Response(upstream.status_code, content=raw).json()
        except ValueError:
            payload = {"error": {"type": "upstream_error", "code": None,
                                 "message": raw[:200].decode(errors="replace")}}
        ok = upstream.status_code == 200
        if ok:
            call.usage.observe(payload)
            payload = wire.client_response(payload, call.deployment.name)
        await self._finish(call, "ok" if ok else "error", upstream.status_code)
        return JSONResponse(payload, status_code=upstream.status_code,
                            headers=self._headers(call))

    def _stream(self, call: Call, upstream: httpx.Response,
                options: wire.ClientStreamOptions) -> StreamRelay:
        def on_payload(payload: dict) -> Optional[dict]:
            call.usage.observe(payload)
            if call.ttft_s is None and wire.has_content(payload):
                call.ttft_s = time.perf_counter() - call.t0
            return wire.client_chunk(payload, call.deployment.name, options)

        async def on_end(outcome: str) -> None:
            if outcome == "done":
                await self._finish(call, "ok", 200)
            elif outcome == "client_gone":
                await self._finish(call, "partial", 499)
            else:
                call.lease.mark_failed()
                delivered = call.usage.completion_tokens > 0
                await self._finish(call, "partial" if delivered else "error", 502)

        headers = [(k.encode(), v.encode()) for k, v in self._headers(call).items()]
        return StreamRelay(upstream, on_payload, on_end, headers)

    def _headers(self, call: Call) -> dict[str, str]:
        return {"x-thawpool-revision": call.revision.name,
                "x-thawpool-replica": str(call.lease.replica_id)}

    async def _finish(self, call: Call, status: str, http_status: int) -> None:
        """Meter the call once and give the replica back."""
        if call.finished:
            return
        call.finished = True
        try:
            self.writer.submit(self._record(call, status, http_status))
            self._observe(call, status)
        finally:
            released = call.lease.release()
            if inspect.isawaitable(released):
                await released

    def _record(self, call: Call, status: str, http_status: int) -> UsageRecord:
        usage, revision = call.usage, call.revision
        cold = getattr(call.lease, "cold_start", None)
        return UsageRecord(
            invocation_id=str(uuid.uuid4()), request_id=call.request_id,
            tenant_id=call.principal.tenant_id, api_key_id=call.principal.key_id,
            deployment_id=call.deployment.id, deployment_name=call.deployment.name,
            revision_id=revision.id, revision_name=revision.name, model=revision.model_uri,
            endpoint=call.endpoint, status=status, http_status=http_status,
            prompt_tokens=usage.prompt_tokens, cached_tokens=usage.cached_tokens,
            completion_tokens=usage.completion_tokens,
            queue_s=getattr(call.lease, "queue_s", None),
            cold_start_s=cold.total_s if cold is not None else None,
            ttft_s=call.ttft_s, total_s=time.perf_counter() - call.t0,
            cost=token_cost(deployments_db.pricing_of(revision), usage.prompt_tokens,
                            usage.cached_tokens, usage.completion_tokens),
            replica_id=str(call.lease.replica_id), started_at=call.started_at,
            finished_at=datetime.now(timezone.utc))

    def _observe(self, call: Call, status: str) -> None:
        name = call.deployment.name
        self.metrics.invocations.labels(name, status).inc()
        self.metrics.tokens.labels(name, "in").inc(call.usage.prompt_tokens)
        self.metrics.tokens.labels(name, "out").inc(call.usage.completion_tokens)
        if call.ttft_s is not None:
            self.metrics.ttft.labels(name).observe(call.ttft_s)
        log.info("invocation", extra={
            "request_id": call.request_id, "deployment": name, "revision": call.revision.name,
            "status": status, "prompt_tokens": call.usage.prompt_tokens,
            "completion_tokens": call.usage.completion_tokens})


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
