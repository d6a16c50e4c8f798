"""A function invocation's steps: resolve, validate, admit, acquire, call, meter.

`routes/functions.invoke` runs them in that order, through the same Gateway parts
as a completion (`Gateway.target`, `admit_tokens`, `lease`): the caller's own
deployment only (404 for any other tenant's), the canary split, rate limits and
the pool's refusals with Retry-After. Bad input is a 400 naming the field
(spec.function_request, the replica's own rule) before anything is woken.

The replica batches items (runtime/functions/worker.py) and answers each call
with its items' share of the batches' compute seconds; the call's usage row
carries `items` (counted by the gateway in the request, never the replica's
word) and `gpu_seconds` (that share, bounded by the call's wall time, times the
revision's GPUs) and is priced at the price book's `per_call`. GPU time itself is billed like a model's:
the replica's lifetime at `gpu_second` (controlplane.billing.lifetimes), so no second of
it is charged twice. A replica that dies mid-call is a 502 and is replaced
(`Lease.mark_failed`); a handler that raised or broke its contract is a 500
`function_error` for that batch's calls only, and its replica keeps serving.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Optional

from controlplane.errors import ApiError
from controlplane.gateway.llm import Gateway, RouteTarget
from controlplane.billing.pricing import invocation_cost
from controlplane.budgets.ledger import Hold
from controlplane.budgets.policy import worst_case
from controlplane.gateway.ratelimit import RateReservation
from controlplane.store.deployments import kind_of
from controlplane.store.tenants import Principal
from controlplane.gateway.upstream import AnswerTooLarge, UpstreamError, UpstreamResponse
from controlplane.billing.usage import UsageRecord
from pool.api import Lease
from spec.function_request import FunctionRequest, parse_function_request

ENDPOINT = "functions/invoke"


@dataclass(frozen=True)
class FunctionAnswer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass
class FunctionReplicaCall:
    principal: Principal
    target: RouteTarget
    request_id: str
    lease: Lease
    admission: RateReservation
    t0: float
    invocation_id: str
    items: int = 0
    gpu_seconds: Optional[float] = None


class FunctionGateway:
    def __init__(self, gateway: Gateway):
        self.gateway = gateway

    async def resolve(self, principal: Principal, name: str, request_id: str) -> RouteTarget:
        target = await self.gateway.target(principal, name, request_id)
        if kind_of(target.revision) != "function":
            raise ApiError(400, f"{name} is a model, not a function: POST /v1/chat/completions",
                           code="wrong_kind")
        return target

    def validate(self, body: Any) -> FunctionRequest:
        return parse_function_request(body)          # ProtocolError: 400 naming the field

    def admit(self, principal: Principal, target: RouteTarget) -> RateReservation:
        return self.gateway.admit_tokens(principal, target, 0)   # requests per minute only

    async def reserve(self, principal: Principal, target: RouteTarget, admission: RateReservation) -> Hold:
        """The per-call price (all a function call is billed) held against its budgets: 429
        budget_exceeded before any replica is woken."""
        return await self.gateway.reserve_amount(principal, target, admission, worst_case(target.pricing, 0, 0))

    async def call(self, principal: Principal, target: RouteTarget, request: FunctionRequest,
                   request_id: str, admission: RateReservation, hold: Hold) -> FunctionAnswer:
        """Acquire a replica (a cold start when there is none), call it, meter the call."""
        lease, t0 = await self.gateway.lease(target, request_id, admission, None, 0, hold=hold)
        call = FunctionReplicaCall(principal, target, request_id, lease, admission, t0, hold.invocation_id)
        try:
            sent = time.perf_counter()
            upstream = await self.gateway.http.post(
                f"{lease.base_url.rstrip('/')}/invoke", _body(request),
                {**lease.headers, "x-request-id": request_id})
            payload = await upstream.json()
            wall_s = time.perf_counter() - sent
        except AnswerTooLarge as exc:
            return self._refused(call, exc.message, "answer_too_large")
        except UpstreamError as exc:
            return self._failed(call, f"the function's replica failed mid-call ({exc.kind}); "
                                      "it is being replaced")
        except ValueError:
            return self._failed(call, "the function's replica answered with something not JSON")
        return self._answer(call, upstream, payload, len(request.items), wall_s)

    def _answer(self, call: FunctionReplicaCall, upstream: UpstreamResponse, payload: Any,
                items: int, wall_s: float) -> FunctionAnswer:
        """An answered call is billed for the items the gateway counted in its request and
        the compute seconds the replica reports, bounded by the call's wall time."""
        if upstream.status_code == 200 and isinstance(payload, dict):
            call.items = items
            compute_s = compute_seconds(payload.pop("usage", None), wall_s)
            call.gpu_seconds = compute_s * call.target.revision.gpu_count
            payload["usage"] = {"items": call.items, "gpu_seconds": call.gpu_seconds}
            if not _json_safe(payload):
                return self._refused(call, "the function's answer holds NaN or Infinity, which "
                                           "JSON cannot carry", "upstream_error")
            self.meter(call, "ok", 200)
            return FunctionAnswer(200, payload, self._headers(call))
        status = upstream.status_code if upstream.status_code in (400, 413, 500) else 502
        self.meter(call, "error", status)
        body = payload if isinstance(payload, dict) and "error" in payload and _json_safe(payload) else {
            "error": {"message": "the function's replica refused the call", "type": "upstream_error",
                      "param": None, "code": "upstream_error"}}
        return FunctionAnswer(status, body, self._headers(call))

    def _failed(self, call: FunctionReplicaCall, message: str) -> FunctionAnswer:
        call.lease.mark_failed()
        self.meter(call, "error", 502)
        refusal = ApiError(502, message, code="replica_failed", retry_after_s=1)
        return FunctionAnswer(502, refusal.body(), {**refusal.headers(), **self._headers(call)})

    def _refused(self, call: FunctionReplicaCall, message: str, code: str) -> FunctionAnswer:
        """The replica answered, but not with something the gateway passes on."""
        self.meter(call, "error", 502)
        refusal = ApiError(502, message, code=code)
        return FunctionAnswer(502, refusal.body(), {**refusal.headers(), **self._headers(call)})

    def meter(self, call: FunctionReplicaCall, status: str, http_status: int) -> None:
        """One usage row, then the replica goes back to the pool."""
        gateway = self.gateway
        gateway.limiter.settle(call.admission, 0, gateway.clock())
        try:
            gateway.writer.submit(self._record(call, status, http_status))
            tenant, name = call.principal.tenant_name, call.target.deployment.name
            gateway.metrics.invocations.labels(tenant, name, status).inc()
        finally:
            call.lease.release()

    def _record(self, call: FunctionReplicaCall, status: str, http_status: int) -> UsageRecord:
        deployment, revision, cold = call.target.deployment, call.target.revision, call.lease.cold_start
        return UsageRecord(
            invocation_id=call.invocation_id, request_id=call.request_id,
            tenant_id=call.principal.tenant_id, api_key_id=call.principal.key_id,
            deployment_id=deployment.id, deployment_name=deployment.name,
            revision_id=revision.id, revision_name=revision.name, model=revision.model_uri,
            endpoint=ENDPOINT, status=status, http_status=http_status,
            prompt_tokens=0, cached_tokens=0, completion_tokens=0, queue_s=call.lease.queue_s,
            cold_start_s=cold.total_s if cold is not None else None, ttft_s=None,
            total_s=time.perf_counter() - call.t0,
            cost=invocation_cost(call.target.pricing, 0, 0, 0, charge_call=status == "ok"),
            replica_id=call.lease.replica_id, started_at=call.target.at,
            finished_at=datetime.now(timezone.utc), items=call.items, gpu_seconds=call.gpu_seconds)

    def _headers(self, call: FunctionReplicaCall) -> dict[str, str]:
        return {"x-thawpool-revision": call.target.revision.name,
                "x-thawpool-replica": call.lease.replica_id}


def compute_seconds(usage: Any, wall_s: float) -> float:
    """The compute seconds a replica reports for a call, as billed: from 0 to the call's
    wall time as the gateway measured it; 0 for anything not a number (NaN included)."""
    value = usage.get("compute_s") if isinstance(usage, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    if isinstance(value, float) and math.isnan(value):
        return 0.0
    return float(min(max(value, 0), wall_s))


def _json_safe(payload: dict[str, Any]) -> bool:
    """The answer can go out as JSON (and into a JSONB column, for an async call): Python
    reads NaN, Infinity and 1e999 from a replica, but no JSON may carry them."""
    try:
        json.dumps(payload, allow_nan=False)
    except ValueError:
        return False
    return True


def _body(request: FunctionRequest) -> dict[str, Any]:
    """What the replica parses again by the same rule (never the client's raw body)."""
    return {"input": request.items[0]} if request.single else {"inputs": list(request.items)}
