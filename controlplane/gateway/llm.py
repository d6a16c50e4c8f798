"""The OpenAI-compatible gateway's steps, each a method: resolve, validate, admit,
reserve (the call's worst case against its spend budgets), acquire, send, relay (unary
or stream) and meter. `routes/gateway.invoke` runs them
in that order; this module never sees the Request.

A call is metered exactly once, however it ends: ok (the replica answered),
partial (the client left, or the stream was cut after tokens were delivered:
billed for what was delivered) or error; the lease goes back to the pool then.
"""
from __future__ import annotations

import json
import logging
import time
import uuid
import weakref
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, AsyncGenerator, Callable, Optional

from sqlalchemy import exc as sa_exc
from starlette.responses import JSONResponse, Response

from controlplane.billing.call_journal import CUT_HTTP_STATUS, Delivered
from controlplane.budgets.ledger import BudgetExceeded, Charge, Hold, Ledger
from controlplane.budgets.policy import worst_case
from controlplane.errors import ApiError
from controlplane.gateway.answer_shape import AnswerShape
from controlplane.gateway.openai_wire import (MAX_TOKENS, UsageSeen,
                                       estimate_completion_tokens, estimate_prompt_tokens,
                                       has_content, prefix_key, prompt_text, prompt_token_bound,
                                       upstream_body)
from controlplane.lookups.service import Lookups
from controlplane.billing.metering import UsageWriter
from controlplane.metrics import Metrics
from controlplane.store.tables import Adapter, Deployment, Revision
from controlplane.billing.pricing import Pricing, invocation_cost
from controlplane.quotas import Quota
from controlplane.gateway.ratelimit import RateReservation, Limited, RateLimits, RateLimiter
from controlplane.settings import Settings
from controlplane.store import deployments
from controlplane.store.budgets import money
from controlplane.store.failures import is_outage
from controlplane.store.tenants import Principal
from controlplane.deploy.traffic import choose
from controlplane.gateway.upstream import AnswerTooLarge, Upstream, UpstreamError, UpstreamResponse
from controlplane.billing.usage import UsageRecord
from pool.api import AdapterRef, Lease, PinnedObject, Pool, RevisionSpec
from spec.engine_options import EngineOptions
from wire.disconnect import Receive, until_disconnect
from wire.errors import ProtocolError, error_body, message_of
from wire.priority import INTERACTIVE_PRIORITY
from wire.requests import GenerationRequest, check_sampling_params, parse_request
from wire.sampling import validate_prompt_ids
from wire.sse import DONE_LINE, EventStreamResponse, data_of

log = logging.getLogger("thawpool.gateway")

# The context a chat without max_tokens may fill, for revisions deployed before the
# model's context length was recorded (migration 0002): the runtime scheduler's default
# max_model_len. Only the token rate limit reads it; the replica knows the real one.
FALLBACK_CONTEXT_LEN = 2048
# A unary answer still arriving after its headers is read under a disconnect watch that
# starts only this late (a task and its cancellation would cost every short call); a
# client that left meanwhile is noticed then. One already whole needs no watch at all.
WATCH_AFTER_S = 0.05
DEFAULT_MAX_LORA_RANK = EngineOptions.max_lora_rank


@dataclass(frozen=True)
class RouteTarget:
    """Where a request goes: the deployment (the caller's, or a shared base) and the
    revision the split chose, the adapter it runs with, the price in effect when it
    arrived (`at`, the usage row's start), the caller tenant's quota (its rate limits)
    and the deployment owner's (the pool's, which holds the replicas)."""
    deployment: Deployment
    revision: Revision
    at: datetime
    pricing: Pricing
    quota: Quota
    adapter: Optional[Adapter] = None
    owner_quota: Optional[Quota] = None     # None: the caller owns the deployment

    @property
    def model_name(self) -> str:
        """What the client is told it called."""
        if self.adapter is None:
            return self.deployment.name
        return f"{self.deployment.name}:{self.adapter.name}"


@dataclass(frozen=True)
class Invocation:
    """A request that passed validation, with what the gateway estimated before the
    replica tokenized it."""
    request: GenerationRequest
    prompt_text: str
    prompt_tokens: int              # estimate
    max_tokens: int                 # wire.requests' rule over the context, times the choices
    prompt_limit: int = MAX_TOKENS      # the most prompt tokens a replica may bill
    completion_limit: int = MAX_TOKENS  # the most completion tokens it may bill
    prompt_bound: int = 0               # what the prompt may count at most, as its text says

    @property
    def reserved_tokens(self) -> tuple[int, int]:
        """(prompt, completion) tokens a budget holds for the call: every token it may
        bill, as far as the request says."""
        return min(self.prompt_bound, self.prompt_limit), min(self.max_tokens, self.completion_limit)

    def usage(self) -> UsageSeen:
        """What the call's replica reports, bounded by what the request could use."""
        return UsageSeen(prompt_limit=self.prompt_limit, completion_limit=self.completion_limit,
                         estimated_prompt=self.prompt_tokens)


@dataclass(frozen=True)
class Outcome:
    status: str                     # ok | partial | error
    http_status: int


CLIENT_GONE = Outcome("partial", 499)


class ReplicaUnreachable(ApiError):
    """The request never reached the replica, or no answer came back (502)."""


@dataclass
class ReplicaCall:
    """One invocation holding a replica: where it went and what it has used so far."""
    principal: Principal
    target: RouteTarget
    request_id: str
    endpoint: str
    lease: Lease
    started_at: datetime
    t0: float
    admission: RateReservation
    usage: UsageSeen = field(default_factory=UsageSeen)
    ttft_s: Optional[float] = None
    saw_done: bool = False          # the replica's stream ended with [DONE]
    metered: bool = False
    released: bool = False          # the lease was given back
    invocation_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    log_fields: dict[str, Any] = field(default_factory=dict)   # its request's access log line
    replica_endpoint: Optional[str] = None  # what the replica serves it as, when not `endpoint`
    # why the call was moved to this deployment, a fallback of the one it named (None: it
    # is the one it named): controlplane.gateway.fallbacks
    fallback_reason: Optional[str] = None
    # a client that runs a cut call again itself, under the same invocation id (the batch
    # runner), is not journaled: a recovered row of the cut attempt would take the id
    # that the answer it keeps must bill
    journaled: bool = True
    priority: int = INTERACTIVE_PRIORITY   # what it waits and runs at (wire/priority.py)


class Gateway:
    def __init__(self, *, lookups: Lookups, pool: Pool, http: Upstream,
                 writer: UsageWriter, metrics: Metrics, settings: Settings, budgets: Ledger,
                 limiter: Optional[RateLimiter] = None,
                 clock: Callable[[], float] = time.monotonic):
        self.lookups = lookups
        self.pool = pool
        self.http = http
        self.writer = writer
        self.metrics = metrics
        self.settings = settings
        self.budgets = budgets
        self.limiter = limiter or RateLimiter()
        self.clock = clock
        # the pool's spec of each revision, built once per (deployment, quota) it was
        # resolved with: the cache hands out the same objects until a change replaces them
        self._specs: weakref.WeakKeyDictionary[Revision, tuple[Deployment, Quota, RevisionSpec]] = \
            weakref.WeakKeyDictionary()

    async def resolve(self, principal: Principal, body: Any, request_id: str) -> RouteTarget:
        """The caller's deployment named by `model`; the revision sticks by request id. All
        from memory (controlplane.lookups.service): no database round trip."""
        if not isinstance(body, dict):
            raise ApiError(400, "body: must be a JSON object", param="body")
        name = body.get("model")
        if not isinstance(name, str) or not name:
            raise ApiError(400, "model: the deployment name is required", param="model")
        resolved = await self.lookups.model(principal.tenant_id, name)
        target = self._target(principal, resolved.deployment, resolved.revisions, request_id, resolved.adapter)
        if deployments.kind_of(target.revision) == "function":
            raise ApiError(400, f"model: {name} is a function: POST /v1/functions/{name}/invoke",
                           param="model", code="wrong_kind")
        return target

    async def target(self, principal: Principal, name: str, request_id: str) -> RouteTarget:
        """The caller's deployment by name (404 for any other tenant's) and the revision the
        split chooses for this request id."""
        deployment, revisions = await self.lookups.deployment(principal.tenant_id, name)
        return self._target(principal, deployment, revisions, request_id)

    def _target(self, principal: Principal, deployment: Deployment, revisions: list[Revision],
                request_id: str, adapter: Optional[Adapter] = None) -> RouteTarget:
        at = datetime.now(timezone.utc)
        by_name = {r.name: r for r in revisions}
        owner = deployment.tenant_id
        return RouteTarget(deployment, by_name[choose(deployment.traffic, request_id)], at,
                           self.lookups.pricing(principal.tenant_id, deployment.id, at,
                                                adapter.id if adapter is not None else None),
                           self.lookups.quota(principal.tenant_id), adapter,
                           None if owner == principal.tenant_id else self.lookups.quota(owner))

    def validate(self, endpoint: str, body: Any, target: RouteTarget) -> Invocation:
        """wire.requests' rules, then what needs the model: token ids inside its vocabulary
        (when the revision recorded it); ProtocolError (400) naming the field."""
        request = parse_request(endpoint, body)
        if target.adapter is not None:
            _check_adapter_slots(target, target.adapter)
        if target.revision.vocab_size is not None:     # NULL before migration 0002
            _check_vocabulary(request, target.revision.vocab_size)
        text = prompt_text(request)
        prompt_tokens = estimate_prompt_tokens(request, text)
        max_tokens = request.max_tokens_within(context_length(target.revision), prompt_tokens)
        prompts = max(1, len(request.prompts))
        choices = prompts * request.params.n            # each may write max_tokens
        # what a replica may bill: each prompt and each choice within the context (when
        # the revision recorded it; the fallback context may be below the model's)
        context = context_length(target.revision) if target.revision.context_length else MAX_TOKENS
        return Invocation(request, text, prompt_tokens, max_tokens * choices,
                          min(MAX_TOKENS, context * prompts), min(MAX_TOKENS, context * choices),
                          max(prompt_tokens, prompt_token_bound(request, body)))

    def priority(self, principal: Principal, invocation: Invocation) -> int:
        """The priority the call waits and runs at: what it asked for within its key's range,
        else the key's default; Forbidden (403) naming `priority` outside the range."""
        return principal.priorities.resolve(invocation.request.priority)

    def admit(self, principal: Principal, target: RouteTarget, invocation: Invocation) -> RateReservation:
        """The key's and its tenant's request and token buckets (429 with Retry-After); the
        tokens reserved are the estimate, corrected by the real usage in `meter`."""
        return self.admit_tokens(principal, target, invocation.prompt_tokens + invocation.max_tokens)

    def admit_tokens(self, principal: Principal, target: RouteTarget, tokens: int) -> RateReservation:
        settings, quota = self.settings, target.quota
        key = RateLimits(principal.requests_per_min or settings.default_requests_per_min,
                     principal.tokens_per_min or settings.default_tokens_per_min)
        scopes = {f"key:{principal.key_id}": ("key", key),
                  f"tenant:{principal.tenant_id}": ("tenant", RateLimits(quota.requests_per_min,
                                                                     quota.tokens_per_min))}
        admitted = self.limiter.admit(scopes, tokens=tokens, now=self.clock())
        if isinstance(admitted, Limited):
            code = admitted.limit if admitted.scope == "key" else f"tenant_{admitted.limit}"
            raise ApiError(429, f"rate limit exceeded: {code}", code=code,
                           retry_after_s=admitted.retry_after_s)
        return admitted

    async def reserve(self, principal: Principal, target: RouteTarget, invocation: Invocation,
                      admission: RateReservation, invocation_id: Optional[str] = None) -> Hold:
        """The prompt's bound plus every token the request may write, at the price in
        effect, held against the call's budgets (`reserve_amount`) under `invocation_id`
        (a new one when None: a batch line brings its own)."""
        prompt, completion = invocation.reserved_tokens
        return await self.reserve_amount(principal, target, admission,
                                         worst_case(target.pricing, prompt, completion), invocation_id)

    async def reserve_amount(self, principal: Principal, target: RouteTarget, admission: RateReservation,
                             amount: Decimal, invocation_id: Optional[str] = None) -> Hold:
        """`amount` held against the tenant's, the key's and the deployment's budgets in
        Postgres (controlplane.budgets.ledger), settled when the call is metered; a tenant
        without budgets (known from memory) holds nothing. A call past a budget is 429
        budget_exceeded naming it, before any replica is acquired, and gives the rate
        limiter's reservation back. While Postgres is away no budget
        can be checked: the call is served as everything memory holds keeps serving, and
        billed (its row counts in its budgets once written), but holds nothing. A database
        that answers too slowly for a free connection is no outage: 503, so a flood of
        calls cannot pass a budget by waiting for the pool."""
        charge = Charge(invocation_id or str(uuid.uuid4()), principal.tenant_id, principal.key_id,
                        target.deployment.id, amount, target.at)
        if not self.lookups.has_budgets(principal.tenant_id):     # from memory: no read
            return Hold(charge.invocation_id)
        try:
            return await self.budgets.reserve(charge)
        except BudgetExceeded as exc:
            self.limiter.settle(admission, 0, self.clock())
            raise ApiError(429, budget_message(exc), code="budget_exceeded",
                           retry_after_s=exc.retry_after_s) from None
        except Exception as exc:
            if not unreachable(exc):
                self.limiter.settle(admission, 0, self.clock())
                raise
            log.warning("budgets not checked: postgres unreachable", extra={"error": repr(exc)[:300]})
            return Hold(charge.invocation_id)
        except BaseException:
            self.limiter.settle(admission, 0, self.clock())
            raise

    async def acquire(self, principal: Principal, target: RouteTarget, invocation: Invocation,
                      request_id: str, endpoint: str, admission: RateReservation,
                      log_fields: dict[str, Any], replica_endpoint: Optional[str] = None,
                      timeout_s: Optional[float] = None, priority: int = INTERACTIVE_PRIORITY,
                      invocation_id: Optional[str] = None) -> ReplicaCall:
        """A lease on a ready replica (a cold start when there is none), waited for
        `timeout_s` (None: the settings' acquire timeout) at `priority` (`priority()` for a
        client's call; the Batch API's BATCH_PRIORITY); the pool's refusals (PoolError)
        become 429/503 with Retry-After, and give the rate reservation back (the budgets'
        hold is its caller's to give back). `endpoint` is what the usage row names;
        `replica_endpoint` the replica's path for it when that differs (the Responses API is
        served as a chat completion); `invocation_id` the budget hold's, which the row that
        bills the call must carry."""
        lease, t0 = await self.lease(target, request_id, admission, prefix_key(invocation.prompt_text),
                                     invocation.prompt_tokens, adapter_ref(target.adapter), timeout_s,
                                     priority)
        return ReplicaCall(principal, target, request_id, endpoint, lease, target.at, t0, admission,
                           usage=invocation.usage(), invocation_id=invocation_id or str(uuid.uuid4()),
                           log_fields=log_fields, replica_endpoint=replica_endpoint, priority=priority)

    async def lease(self, target: RouteTarget, request_id: str, admission: RateReservation,
                    prefix: Optional[str], prompt_tokens: int,
                    adapter: Optional[AdapterRef] = None,
                    timeout_s: Optional[float] = None,
                    priority: int = INTERACTIVE_PRIORITY, hold: Optional[Hold] = None) -> tuple[Lease, float]:
        """The pool's lease (and when the wait for it began), waited for at `priority`; a
        refusal gives the rate limiter's reservation back, and `hold`'s budgets when given."""
        t0 = time.perf_counter()
        wait_s = self.settings.acquire_timeout_s if timeout_s is None else timeout_s
        try:
            lease = await self.pool.acquire(
                self._spec(target), request_id=request_id, prefix_key=prefix,
                prompt_tokens=prompt_tokens, timeout_s=wait_s, adapter=adapter, priority=priority)
        except BaseException:
            self.limiter.settle(admission, 0, self.clock())
            if hold is not None:
                await self.release_budgets(hold)
            raise
        return lease, t0

    async def release_budgets(self, hold: Hold) -> None:
        """A call that never reached a replica holds no budget; one the database cannot
        release now is released by its deadline (settings.budget_reservation_ttl_s)."""
        try:
            await self.budgets.release(hold)
        except Exception as exc:  # noqa: BLE001 - the reservation's deadline frees it
            log.warning("budget reservation not released; it expires", extra={"error": repr(exc)[:300]})

    def _spec(self, target: RouteTarget) -> RevisionSpec:
        quota = target.owner_quota or target.quota       # the replicas are the owner's
        held = self._specs.get(target.revision)
        if held is not None and held[0] is target.deployment and held[1] is quota:
            return held[2]
        spec = deployments.revision_spec(target.deployment, target.revision, quota.for_pool())
        self._specs[target.revision] = (target.deployment, quota, spec)
        return spec

    async def send(self, call: ReplicaCall, body: dict[str, Any]) -> UpstreamResponse:
        """The request to the replica, its response still streaming; 502 if unreachable.

        The call is journaled until metered, so that a control plane killed meanwhile
        leaves it to the next start to bill (controlplane.billing.call_journal). The open frame is
        written once the request is on its way, while the replica works on it: off the
        call's latency, and before any of the answer can reach the client."""
        try:
            pending = await self.http.request(
                f"{call.lease.base_url.rstrip('/')}/v1/{call.replica_endpoint or call.endpoint}",
                upstream_body(body, call.target.adapter.id if call.target.adapter is not None else None,
                              call.priority),
                {**call.lease.headers, "x-request-id": call.request_id})
            if call.journaled:
                self.writer.calls.open(self._record(call, Outcome("error", CUT_HTTP_STATUS)),
                                       call.target.pricing)
            return await pending.answer()
        except UpstreamError as exc:
            call.lease.mark_failed()
            self.give_back_id(call)
            await self.meter(call, Outcome("error", 502))
            raise ReplicaUnreachable(502, f"replica unreachable: {exc.kind}",
                                     code="replica_unreachable", retry_after_s=1) from None

    def ready(self, target: RouteTarget) -> bool:
        """The pool has a ready replica of the target's revision now."""
        return self.pool.revision_status(target.revision.id).state == "ready"

    async def drop(self, call: ReplicaCall, upstream: UpstreamResponse) -> None:
        """An answer that failed before any of it was relayed (a 5xx), which another
        deployment will answer instead: the replica is checked before its next request,
        and the call is recorded as an `error` that bills nothing."""
        await _quietly_close(upstream)
        call.lease.mark_failed()
        call.usage = UsageSeen()
        self.give_back_id(call)
        await self.meter(call, Outcome("error", upstream.status_code))

    def give_back_id(self, call: ReplicaCall) -> None:
        """A failed attempt's row takes an id of its own: the call's (its budget hold's) is
        for the row of the attempt that answers, or the hold is released unsettled. Its
        journal frame, if the request went out, is closed under the old id first."""
        if call.journaled:
            self.writer.calls.close(call.invocation_id)
        call.invocation_id = str(uuid.uuid4())

    async def relay_unary(self, call: ReplicaCall, upstream: UpstreamResponse,
                          receive: Receive, shape: AnswerShape) -> tuple[Response, Outcome]:
        """The replica's whole answer for the client, in `shape`; 499 (billed as partial)
        if the client left first; 502 (an `error` row, nothing delivered) if the replica
        failed: a 5xx, or an answer that broke off."""
        try:
            raw = upstream.whole_body()          # a short answer is usually whole by now
            if raw is None:
                raw = await until_disconnect(receive, upstream.aread(), watch_after_s=WATCH_AFTER_S)
        except AnswerTooLarge as exc:
            return self._refused(call, exc.message, "answer_too_large")
        except UpstreamError as exc:
            return self._upstream_failed(call, f"the replica's answer broke off ({exc.kind})")
        finally:
            await upstream.aclose()
        if raw is None:
            return Response(status_code=499), CLIENT_GONE
        if upstream.status_code >= 500:
            return self._upstream_failed(call, f"the replica failed ({upstream.status_code}): "
                                               f"{message_of(raw)}")
        try:
            payload = json.loads(raw)
        except ValueError:
            return self._upstream_failed(call, "the replica's answer is not JSON")
        if not isinstance(payload, dict):
            return self._upstream_failed(call, "the replica's answer is not a JSON object")
        ok = upstream.status_code == 200
        if ok:
            call.usage.observe(payload)
            if not call.usage.reported:       # the client sees what is billed
                call.usage.counted_completion = estimate_completion_tokens(payload)
                call.usage.fall_back()
                payload["usage"] = call.usage.as_openai()
            payload = await self._shaped(call, payload, shape)
        try:
            response = JSONResponse(payload, status_code=upstream.status_code,
                                    headers=self._headers(call))
        except ValueError:                    # NaN or Infinity: not JSON a client can read
            return self._upstream_failed(call, "the replica's answer holds numbers JSON cannot carry")
        return response, Outcome("ok" if ok else "error", upstream.status_code)

    async def _shaped(self, call: ReplicaCall, payload: dict[str, Any], shape: AnswerShape) -> dict[str, Any]:
        """The answer in the client's shape; the replica is given back first (the shape may
        write to Postgres). A shape that fails leaves the client nothing: nothing billed."""
        self.release(call)
        try:
            return await shape.whole(payload, call.usage)
        except BaseException:
            call.usage = UsageSeen()
            await self.meter(call, Outcome("error", 503))
            raise

    def _upstream_failed(self, call: ReplicaCall, message: str) -> tuple[Response, Outcome]:
        """The replica failed: the pool checks it before it takes another request."""
        call.lease.mark_failed()
        return self._refused(call, message, "upstream_error")

    def _refused(self, call: ReplicaCall, message: str, code: str) -> tuple[Response, Outcome]:
        """A 502 in the error shape; the client got nothing, so the row bills nothing."""
        call.usage = UsageSeen()
        refusal = ApiError(502, message, code=code)
        response = refusal.response()
        response.headers.update(self._headers(call))
        return response, Outcome("error", 502)

    def relay_stream(self, call: ReplicaCall, upstream: UpstreamResponse,
                     shape: AnswerShape) -> EventStreamResponse:
        """The replica's chunks as the client asked for them (`shape`); metered when the
        stream closes: done, the client gone (partial, 499) or cut upstream (502)."""
        async def on_close(completed: bool) -> None:
            await _quietly_close(upstream)
            # [DONE] went out after the whole answer: a client that hangs up then (the
            # openai client does, while we still read the replica's end) got it all
            if call.saw_done:
                outcome = Outcome("ok", 200)
            elif not completed:
                outcome = CLIENT_GONE
            else:
                call.lease.mark_failed()
                delivered = call.usage.completion_tokens > 0
                outcome = Outcome("partial" if delivered else "error", 502)
            await self.meter(call, outcome)

        headers = [(k.encode(), v.encode()) for k, v in self._headers(call).items()]
        return EventStreamResponse(self._events(call, upstream, shape), on_close, headers)

    async def _events(self, call: ReplicaCall, upstream: UpstreamResponse,
                      shape: AnswerShape) -> AsyncGenerator[bytes, None]:
        try:
            for event in shape.opening():
                yield event
            async for line in upstream.aiter_lines():
                if line == DONE_LINE:
                    call.saw_done = True
                    call.usage.fall_back()    # without a usage it could take: the counts billed
                    for event in await shape.closing(call.usage):
                        yield event
                    self._delivered(call)
                    continue
                payload = data_of(line)
                if payload is None:
                    continue
                if "error" in payload:        # the replica's own: relayed, and no
                    yield shape.failure(payload)   # [DONE] follows (the answer is cut)
                    continue
                call.usage.observe(payload)
                if call.usage.malformed:      # the client sees what is billed
                    call.usage.fall_back()
                    payload["usage"] = call.usage.as_openai()
                if call.ttft_s is None and has_content(payload):
                    call.ttft_s = time.perf_counter() - call.t0
                frames = shape.frames(payload)
                if frames:
                    for event in frames:
                        yield event
                    call.usage.counted_completion += 1
                    self._delivered(call)     # the chunk is in the client's connection
        except ValueError:                    # a line that is not JSON: the answer is cut
            log.warning("replica stream malformed", extra={"request_id": call.request_id})
            yield shape.failure(error_body("the replica sent a malformed event", 502, code="upstream_error"))
        except AnswerTooLarge as exc:
            log.warning("replica stream refused", extra={"error": exc.message})
            yield shape.failure(error_body(exc.message, 502, code="answer_too_large"))
        except UpstreamError as exc:
            log.warning("replica stream cut", extra={"error": repr(exc)})
            yield shape.failure(error_body("the replica stream ended early", 502))

    async def meter(self, call: ReplicaCall, outcome: Outcome) -> None:
        """Record the call once and give the replica back."""
        if call.metered:
            return
        call.metered = True
        if call.usage.malformed or outcome.status == "ok":
            call.usage.fall_back()
        used = call.usage.prompt_tokens + call.usage.completion_tokens
        self.limiter.settle(call.admission, used, self.clock())
        try:
            self.writer.submit(self._record(call, outcome))
            self.writer.calls.close(call.invocation_id)
            self._observe(call, outcome.status)
        finally:
            self.release(call)

    def release(self, call: ReplicaCall) -> None:
        """Give the replica back, once (before its answer is sent, for a unary call: a
        client that reads slowly does not hold the replica)."""
        if not call.released:
            call.released = True
            call.lease.release()

    def _delivered(self, call: ReplicaCall) -> None:
        usage = call.usage
        self.writer.calls.progress_after_flush(call.invocation_id, Delivered(
            usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens, call.ttft_s, time.time(),
            done=call.saw_done))

    def _headers(self, call: ReplicaCall) -> dict[str, str]:
        headers = {"x-thawpool-served-by": call.target.model_name,
                   "x-thawpool-revision": call.target.revision.name,
                   "x-thawpool-replica": call.lease.replica_id}
        if call.fallback_reason is not None:         # a fallback answered: why
            headers["x-thawpool-fallback-reason"] = call.fallback_reason
        if call.lease.adapter_load is not None:      # the call waited for its adapter's load
            headers["x-thawpool-adapter-load-s"] = f"{call.lease.adapter_load.total_s:.3f}"
        return headers

    def _record(self, call: ReplicaCall, outcome: Outcome) -> UsageRecord:
        usage, deployment, revision = call.usage, call.target.deployment, call.target.revision
        cold, adapter, adapter_load = call.lease.cold_start, call.target.adapter, call.lease.adapter_load
        return UsageRecord(
            invocation_id=call.invocation_id, request_id=call.request_id,
            tenant_id=call.principal.tenant_id, api_key_id=call.principal.key_id,
            deployment_id=deployment.id, deployment_name=deployment.name,
            revision_id=revision.id, revision_name=revision.name, model=revision.model_uri,
            endpoint=call.endpoint, status=outcome.status, http_status=outcome.http_status,
            prompt_tokens=usage.prompt_tokens, cached_tokens=usage.cached_tokens,
            completion_tokens=usage.completion_tokens, queue_s=call.lease.queue_s,
            cold_start_s=cold.total_s if cold is not None else None,
            ttft_s=call.ttft_s, total_s=time.perf_counter() - call.t0,
            cost=invocation_cost(call.target.pricing, usage.prompt_tokens, usage.cached_tokens,
                                 usage.completion_tokens, charge_call=outcome.status != "error"),
            replica_id=call.lease.replica_id, started_at=call.started_at,
            finished_at=datetime.now(timezone.utc),
            adapter_id=adapter.id if adapter is not None else None,
            adapter_name=adapter.name if adapter is not None else None,
            adapter_load_s=adapter_load.total_s if adapter_load is not None else None)

    def _observe(self, call: ReplicaCall, status: str) -> None:
        """Per-deployment metrics, labelled with tenant names: the internal listener only;
        the call's fields for its request's access log line."""
        tenant, name = call.principal.tenant_name, call.target.deployment.name
        self.metrics.invocations.labels(tenant, name, status).inc()
        self.metrics.tokens.labels(tenant, name, "in").inc(call.usage.prompt_tokens)
        self.metrics.tokens.labels(tenant, name, "out").inc(call.usage.completion_tokens)
        if call.ttft_s is not None:
            self.metrics.ttft.labels(tenant, name).observe(call.ttft_s)
        if call.lease.adapter_load is not None:
            self.metrics.adapter_loads.labels(tenant, name).observe(call.lease.adapter_load.total_s)
        if call.target.adapter is not None:
            call.log_fields["adapter"] = call.target.adapter.name
        call.log_fields.update(
            deployment=name, revision=call.target.revision.name, outcome=status,
            invocation_id=call.invocation_id, prompt_tokens=call.usage.prompt_tokens,
            completion_tokens=call.usage.completion_tokens, priority=call.priority)


def unreachable(exc: Exception) -> bool:
    """Postgres is away (controlplane.store.failures), not this process's pool of
    connections all busy (SQLAlchemy's TimeoutError: the caller gets 503)."""
    return is_outage(exc) and not isinstance(exc, sa_exc.TimeoutError)


def budget_message(exc: BudgetExceeded) -> str:
    """Which budget, and by how much the call would pass it."""
    s = exc.standing
    per = "in total" if s.period == "none" else f"per {s.period}"
    return (f"budget exceeded: the {s.scope} budget {s.budget_id} ({s.scope} {s.scope_id}) allows "
            f"{money(s.limit)} {per}; {money(s.spent)} spent and {money(s.reserved)} held by calls "
            f"in flight, and this call may cost up to {money(exc.amount)}")


def _check_adapter_slots(target: RouteTarget, adapter: Adapter) -> None:
    """The revision the split chose runs adapters (a base changed since the attach may
    not): 409 before any replica is acquired."""
    engine = target.revision.engine
    if engine.get("task", "generate") != "generate":
        raise ApiError(400, "model: adapters run on generating models", param="model")
    if not engine.get("max_loras"):
        raise ApiError(409, f"model: {target.deployment.name} {target.revision.name} has no adapter "
                            "slots (engine max_loras)", param="model", code="no_adapter_slots")
    if adapter.rank > int(engine.get("max_lora_rank") or DEFAULT_MAX_LORA_RANK):
        raise ApiError(409, f"model: adapter rank {adapter.rank} is above {target.deployment.name} "
                            f"{target.revision.name}'s max_lora_rank", param="model", code="no_adapter_slots")


def adapter_ref(adapter: Optional[Adapter]) -> Optional[AdapterRef]:
    """What the pool needs to load the adapter: its files as attached, and whose they are."""
    if adapter is None:
        return None
    pins = {uri: PinnedObject(str(p["etag"]), int(p["size"])) for uri, p in adapter.pinned_objects.items()}
    return AdapterRef(adapter.id, adapter.adapter_uri, adapter.tenant_id, pins, adapter.weight_bytes)


def _check_vocabulary(request: GenerationRequest, vocab_size: int) -> None:
    """Token ids (the prompt's, stop_token_ids) inside the model's vocabulary."""
    check_sampling_params(request.params, vocab_size)
    for prompt in request.prompts:
        if isinstance(prompt, list):
            try:
                validate_prompt_ids(prompt, vocab_size)
            except ValueError as exc:
                raise ProtocolError.from_value_error(exc) from None


def context_length(revision: Revision) -> int:
    """The context a request may fill, as the replica computes it: the model's, capped by
    the engine's max_model_len when the revision sets one."""
    limit = revision.context_length or FALLBACK_CONTEXT_LEN
    engine_limit = revision.engine.get("max_model_len")
    return min(limit, engine_limit) if isinstance(engine_limit, int) else limit


async def _quietly_close(upstream: UpstreamResponse) -> None:
    try:
        await upstream.aclose()
    except Exception:  # noqa: BLE001 - closing a broken stream may fail; nothing to do
        pass
