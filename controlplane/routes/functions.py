"""Function invocation: POST /v1/functions/{name}/invoke[?async=true], GET /v1/functions/calls/{id}."""
from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from controlplane.gateway.async_calls import TooManyInFlight
from controlplane.errors import ApiError, api_error_for
from controlplane.routes.api import OBJECT, ApiRoute, Operation, Param, scope
from controlplane.routes.context import app_state, read_json, request_id, require
from pool.api import PoolError


async def invoke(request: Request) -> Response:
    """auth → resolve → validate → admit → reserve (budgets), then the call: now, or in the background with
    ?async=true (202 and a call id, once the call is in Postgres: controlplane.gateway.async_calls).
    Every refusal comes before a replica is woken."""
    state = app_state(request)
    functions, rid = state.functions, request_id(request)
    principal = require(request, "invoke")
    body = await read_json(request)
    target = await functions.resolve(principal, request.path_params["name"], rid)
    parsed = functions.validate(body)
    admission = functions.admit(principal, target)
    hold = await functions.reserve(principal, target, admission)
    if request.query_params.get("async") not in ("true", "1"):
        answer = await functions.call(principal, target, parsed, rid, admission, hold)
        return JSONResponse(answer.body, status_code=answer.status, headers=answer.headers)

    async def run() -> tuple[int, dict[str, Any]]:
        try:
            answer = await functions.call(principal, target, parsed, rid, admission, hold)
            return answer.status, answer.body
        except (ApiError, PoolError) as exc:          # what a sync call would have answered
            refusal = api_error_for(exc)
            return refusal.status, refusal.body()
    try:      # Postgres down here: the app's database handler answers 503 with Retry-After
        stored = await state.async_calls.accept(
            principal.tenant_id, target.deployment.name, run,
            tenant_limit=state.lookups.quota(principal.tenant_id).max_async_calls)
    except TooManyInFlight as exc:
        await state.gateway.release_budgets(hold)
        raise ApiError(429, str(exc), code="too_many_async_calls", param=exc.param,
                       retry_after_s=5) from None
    except BaseException:
        await state.gateway.release_budgets(hold)
        raise
    return JSONResponse(stored.view(), status_code=202)


async def get_call(request: Request) -> Response:
    principal = require(request, "invoke")
    call = await app_state(request).async_calls.get(principal.tenant_id, request.path_params["id"])
    if call is None:
        raise ApiError(404, f"no function call {request.path_params['id']}", code="call_not_found")
    return JSONResponse(call.view())


INVOKE_BODY = {"type": "object", "properties": {
    "input": {"type": "object"}, "inputs": {"type": "array", "items": {"type": "object"}}}}
INVOKE = scope("invoke")
routes = [
    ApiRoute("/v1/functions/{name}/invoke", invoke, "POST", Operation(
        "Invoke a function deployment ({input} -> {output}, {inputs} -> {outputs})", INVOKE,
        body=INVOKE_BODY, response=OBJECT,
        query=(Param("async", {"enum": ["true", "false"]}, "true: 202 with a call id"),))),
    ApiRoute("/v1/functions/calls/{id}", get_call, "GET", Operation(
        "An asynchronous function call's status and result", INVOKE, response=OBJECT)),
]
