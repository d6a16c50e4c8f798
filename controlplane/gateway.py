"""The OpenAI-compatible gateway's steps, each a method: resolve, validate, admit,
acquire, send, relay (unary or stream) and meter. `routes/gateway.invoke` runs them
in that order; this module never sees the Request.

A call is metered exactly once, however it ends: ok (the replica answered),
partial (the client left, or the stream was cut after tokens were delivered:
billed for what was delivered) or error; the lease goes back to the pool then.
"""
from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, AsyncGenerator, Callable, Optional

import httpx
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from starlette.responses import JSONResponse, Response

from controlplane.errors import ApiError
from controlplane.gateway_wire import (UsageSeen, client_chunk, client_response,
                                       estimate_prompt_tokens, has_content, prefix_key,
                                       prompt_text, upstream_body)
from controlplane.metering import UsageWriter
from controlplane.metrics import Metrics
from controlplane.models import Deployment, Revision
from controlplane.pricing import token_cost
from controlplane.ratelimit import RateLimiter
from controlplane.settings import Settings
from controlplane.store import deployments
from controlplane.store.tenants import Principal
from controlplane.traffic import choose
from controlplane.usage import UsageRecord
from pool.api import Lease, Pool
from wire.disconnect import Receive, until_disconnect
from wire.errors import ProtocolError, error_body
from wire.requests import GenerationRequest, StreamOptions, check_sampling_params, parse_request
from wire.sampling import validate_prompt_ids
from wire.sse import DONE_LINE, SSE_DONE, EventStreamResponse, data_of, sse

log = logging.getLogger("thawpool.gateway")

# The context a chat without max_tokens may fill, for revisions deployed before the
# model's context length was recorded (migration 0002): the runtime scheduler's default
# max_model_len. Only the token rate limit reads it; the replica knows the real one.
FALLBACK_CONTEXT_LEN = 2048


@dataclass(frozen=True)
class Target:
    """Where a request goes: the caller's deployment and the revision the split chose."""
    deployment: Deployment
    revision: Revision


@dataclass(frozen=True)
class Invocation:
    """A request that passed validation, with what the gateway estimated before the
    replica tokenized it."""
    request: GenerationRequest
    prompt_text: str
    prompt_tokens: int              # estimate
    max_tokens: int                 # wire.requests' rule over the model's context


@dataclass(frozen=True)
class Outcome:
    status: str                     # ok | partial | error
    http_status: int


CLIENT_GONE = Outcome("partial", 499)


@dataclass
class Call:
    """One invocation holding a replica: where it went and what it has used so far."""
    principal: Principal
    target: Target
    request_id: str
    endpoint: str
    lease: Lease
    started_at: datetime
    t0: float
    usage: UsageSeen = field(default_factory=UsageSeen)
    ttft_s: Optional[float] = None
    saw_done: bool = False          # the replica's stream ended with [DONE]
    metered: bool = False


class Gateway:
    def __init__(self, *, sessions: async_sessionmaker[AsyncSession], pool: Pool,
                 http: httpx.AsyncClient, writer: UsageWriter, metrics: Metrics,
                 settings: Settings, limiter: Optional[RateLimiter] = None,
                 clock: Callable[[], float] = time.monotonic):
        self.sessions = sessions
        self.pool = pool
        self.http = http
        self.writer = writer
        self.metrics = metrics
        self.settings = settings
        self.limiter = limiter or RateLimiter()
        self.clock = clock

    async def resolve(self, principal: Principal, body: Any, request_id: str) -> Target:
        """The caller's deployment named by `model`; the revision sticks by request id."""
        if not isinstance(body, dict):
            raise ApiError(400, "body: must be a JSON object", param="body")
        name = body.get("model")
        if not isinstance(name, str) or not name:
            raise ApiError(400, "model: the deployment name is required", param="model")
        async with self.sessions() as session:
            deployment, revisions = await deployments.find_with_revisions(
                session, principal.tenant_id, name)
        by_name = {r.name: r for r in revisions}
        return Target(deployment, by_name[choose(deployment.traffic, request_id)])

    def validate(self, endpoint: str, body: Any, target: Target) -> Invocation:
        """wire.requests' rules, then what needs the model: token ids inside its vocabulary
        (when the revision recorded it); ProtocolError (400) naming the field."""
        request = parse_request(endpoint, body)
        if target.revision.vocab_size is not None:     # NULL before migration 0002
            _check_vocabulary(request, target.revision.vocab_size)
        text = prompt_text(request)
        prompt_tokens = estimate_prompt_tokens(request, text)
        max_tokens = request.max_tokens_within(context_length(target.revision), prompt_tokens)
        return Invocation(request, text, prompt_tokens, max_tokens)

    def admit(self, principal: Principal, invocation: Invocation) -> None:
        """The key's request and token buckets (429 with Retry-After)."""
        limited = self.limiter.admit(
            principal.key_id,
            requests_per_min=principal.requests_per_min or self.settings.default_requests_per_min,
            tokens_per_min=principal.tokens_per_min or self.settings.default_tokens_per_min,
            tokens=invocation.prompt_tokens + invocation.max_tokens, now=self.clock())
        if limited is not None:
            raise ApiError(429, f"rate limit exceeded: {limited.limit}", code=limited.limit,
                           retry_after_s=limited.retry_after_s)

    async def acquire(self, principal: Principal, target: Target, invocation: Invocation,
                      request_id: str, endpoint: str) -> Call:
        """A lease on a ready replica (a cold start when there is none); the pool's
        refusals (PoolError) become 429/503 with Retry-After."""
        started_at, t0 = datetime.now(timezone.utc), time.perf_counter()
        lease = await self.pool.acquire(
            deployments.revision_spec(target.deployment, target.revision),
            request_id=request_id, prefix_key=prefix_key(invocation.prompt_text),
            prompt_tokens=invocation.prompt_tokens, timeout_s=self.settings.acquire_timeout_s)
        return Call(principal, target, request_id, endpoint, lease, started_at, t0)

    async def send(self, call: Call, body: dict[str, Any]) -> httpx.Response:
        """The request to the replica, its response still streaming; 502 if unreachable."""
        try:
            return await self.http.send(self.http.build_request(
                "POST", f"{call.lease.base_url.rstrip('/')}/v1/{call.endpoint}",
                json=upstream_body(body), headers={"x-request-id": call.request_id}),
                stream=True)
        except httpx.HTTPError as exc:
            call.lease.mark_failed()
            await self.meter(call, Outcome("error", 502))
            raise ApiError(502, f"replica unreachable: {type(exc).__name__}",
                           code="replica_unreachable", retry_after_s=1) from None

    async def relay_unary(self, call: Call, upstream: httpx.Response,
                          receive: Receive) -> tuple[Response, Outcome]:
        """The replica's whole answer (or its error) for the client, unless the client
        left first (499, billed as partial)."""
        try:
            raw = await until_disconnect(receive, upstream.aread())
        except httpx.HTTPError:
            raw = None
            call.lease.mark_failed()
        finally:
            await upstream.aclose()
        if raw is None:
            return Response(status_code=499), CLIENT_GONE
        try:
            payload = httpx.Response(upstream.status_code, content=raw).json()
        except ValueError:
            payload = error_body(raw[:200].decode(errors="replace"), 502)
        ok = upstream.status_code == 200
        if ok:
            call.usage.observe(payload)
            payload = client_response(payload, call.target.deployment.name)
        return (JSONResponse(payload, status_code=upstream.status_code,
                             headers=self._headers(call)),
                Outcome("ok" if ok else "error", upstream.status_code))

    def relay_stream(self, call: Call, upstream: httpx.Response,
                     options: StreamOptions) -> EventStreamResponse:
        """The replica's chunks as the client asked for them; metered when the stream
        closes: done, the client gone (partial, 499) or cut upstream (502)."""
        async def on_close(completed: bool) -> None:
            await _quietly_close(upstream)
            if not completed:
                outcome = CLIENT_GONE
            elif call.saw_done:
                outcome = Outcome("ok", 200)
            else:
                call.lease.mark_failed()
                delivered = call.usage.completion_tokens > 0
                outcome = Outcome("partial" if delivered else "error", 502)
            await self.meter(call, outcome)

        headers = [(k.encode(), v.encode()) for k, v in self._headers(call).items()]
        return EventStreamResponse(self._events(call, upstream, options), on_close, headers)

    async def _events(self, call: Call, upstream: httpx.Response,
                      options: StreamOptions) -> AsyncGenerator[bytes, None]:
        try:
            async for line in upstream.aiter_lines():
                if line == DONE_LINE:
                    call.saw_done = True
                    yield SSE_DONE
                    continue
                payload = data_of(line)
                if payload is None:
                    continue
                call.usage.observe(payload)
                if call.ttft_s is None and has_content(payload):
                    call.ttft_s = time.perf_counter() - call.t0
                chunk = client_chunk(payload, call.target.deployment.name, options)
                if chunk is not None:
                    yield sse(chunk)
        except httpx.HTTPError as exc:
            log.warning("replica stream cut", extra={"error": repr(exc)})
            yield sse(error_body("the replica stream ended early", 502))

    async def meter(self, call: Call, outcome: Outcome) -> None:
        """Record the call once and give the replica back."""
        if call.metered:
            return
        call.metered = True
        try:
            self.writer.submit(self._record(call, outcome))
            self._observe(call, outcome.status)
        finally:
            call.lease.release()

    def _headers(self, call: Call) -> dict[str, str]:
        return {"x-thawpool-revision": call.target.revision.name,
                "x-thawpool-replica": call.lease.replica_id}

    def _record(self, call: Call, outcome: Outcome) -> UsageRecord:
        usage, deployment, revision = call.usage, call.target.deployment, call.target.revision
        cold = call.lease.cold_start
        return UsageRecord(
            invocation_id=str(uuid.uuid4()), request_id=call.request_id,
            tenant_id=call.principal.tenant_id, api_key_id=call.principal.key_id,
            deployment_id=deployment.id, deployment_name=deployment.name,
            revision_id=revision.id, revision_name=revision.name, model=revision.model_uri,
            endpoint=call.endpoint, status=outcome.status, http_status=outcome.http_status,
            prompt_tokens=usage.prompt_tokens, cached_tokens=usage.cached_tokens,
            completion_tokens=usage.completion_tokens, queue_s=call.lease.queue_s,
            cold_start_s=cold.total_s if cold is not None else None,
            ttft_s=call.ttft_s, total_s=time.perf_counter() - call.t0,
            cost=token_cost(deployments.pricing_of(revision), usage.prompt_tokens,
                            usage.cached_tokens, usage.completion_tokens),
            replica_id=call.lease.replica_id, started_at=call.started_at,
            finished_at=datetime.now(timezone.utc))

    def _observe(self, call: Call, status: str) -> None:
        name = call.target.deployment.name
        self.metrics.invocations.labels(name, status).inc()
        self.metrics.tokens.labels(name, "in").inc(call.usage.prompt_tokens)
        self.metrics.tokens.labels(name, "out").inc(call.usage.completion_tokens)
        if call.ttft_s is not None:
            self.metrics.ttft.labels(name).observe(call.ttft_s)
        log.info("invocation", extra={
            "request_id": call.request_id, "deployment": name,
            "revision": call.target.revision.name, "status": status,
            "prompt_tokens": call.usage.prompt_tokens,
            "completion_tokens": call.usage.completion_tokens})


def _check_vocabulary(request: GenerationRequest, vocab_size: int) -> None:
    """Token ids (the prompt's, stop_token_ids) inside the model's vocabulary."""
    check_sampling_params(request.params, vocab_size)
    if isinstance(request.prompt, list):
        try:
            validate_prompt_ids(request.prompt, vocab_size)
        except ValueError as exc:
            raise ProtocolError.from_value_error(exc) from None


def context_length(revision: Revision) -> int:
    """The context a request may fill, as the replica computes it: the model's, capped by
    the engine's max_model_len when the revision sets one."""
    limit = revision.context_length or FALLBACK_CONTEXT_LEN
    engine_limit = revision.engine.get("max_model_len")
    return min(limit, engine_limit) if isinstance(engine_limit, int) else limit


async def _quietly_close(upstream: httpx.Response) -> None:
    try:
        await upstream.aclose()
    except Exception:  # noqa: BLE001 - closing a broken stream may fail; nothing to do
        pass
