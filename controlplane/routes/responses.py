"""The OpenAI Responses API: POST /v1/responses (SSE typed events when stream is true),
GET and DELETE /v1/responses/{id} of a stored response (controlplane.gateway.responses)."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from controlplane.gateway.fallbacks import ClientRequest, first_answer
from controlplane.routes.api import OBJECT, ApiRoute, Operation, scope
from controlplane.routes.context import app_state, read_json, request_id, require
from controlplane.routes.gateway import GatewayResponse, MeteredResponse
from wire.request_id import access_fields


async def create(request: Request) -> GatewayResponse:
    """The chat gateway's steps (routes/gateway.invoke), in the Responses API's shape:
    everything that can refuse the call does so before a replica is acquired."""
    state = app_state(request)
    gateway, responses = state.gateway, state.responses
    principal = require(request, "invoke")
    turn = await responses.prepare(principal, await read_json(request))       # parse, earlier turns
    target = await gateway.resolve(principal, turn.chat, request_id(request))   # resolve
    invocation = responses.validate(turn, target)                              # validate
    priority = gateway.priority(principal, invocation)                         # the key's range
    admission = gateway.admit(principal, target, invocation)                   # rate limits
    hold = await gateway.reserve(principal, target, invocation, admission)     # budgets
    client = ClientRequest(principal, turn.chat, request_id(request), "responses", access_fields(request.scope),
                           lambda other: responses.validate(turn, other), replica_endpoint="chat/completions",
                           priority=priority)
    answer = await first_answer(gateway, client, target, invocation, admission, hold)   # acquire, send
    call, upstream = answer.call, answer.upstream                              # relay
    shape = responses.shape(principal, call.target, turn)
    if turn.request.stream and upstream.status_code == 200:
        return gateway.relay_stream(call, upstream, shape)     # stored and metered as it closes
    response, outcome = await gateway.relay_unary(call, upstream, request.receive, shape)
    gateway.release(call)
    return MeteredResponse(response, lambda: gateway.meter(call, outcome))


async def retrieve(request: Request) -> JSONResponse:
    principal = require(request, "invoke")
    stored = await app_state(request).responses.find(principal, request.path_params["response_id"])
    return JSONResponse(stored.response)


async def delete(request: Request) -> JSONResponse:
    principal = require(request, "invoke")
    response_id = request.path_params["response_id"]
    await app_state(request).responses.delete(principal, response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


MESSAGE = {"type": "object", "properties": {
    "type": {"type": "string", "enum": ["message", "function_call", "function_call_output"]},
    "role": {"type": "string"}, "content": {"type": ["string", "array"]}}}
CREATE_BODY = {"type": "object", "required": ["model", "input"], "properties": {
    "model": {"type": "string", "description": "the deployment name"},
    "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": MESSAGE}]},
    "instructions": {"type": "string"}, "max_output_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number"}, "top_p": {"type": "number"}, "stream": {"type": "boolean"},
    "previous_response_id": {"type": "string"}, "store": {"type": "boolean"},
    "tools": {"type": "array", "items": {"type": "object"}},
    "tool_choice": {"anyOf": [{"type": "string", "enum": ["none", "auto", "required"]}, {"type": "object"}]},
    "text": {"type": "object"}, "metadata": {"type": "object", "additionalProperties": {"type": "string"}}}}
DELETED = {"type": "object", "required": ["id", "deleted"], "properties": {
    "id": {"type": "string"}, "object": {"type": "string"}, "deleted": {"type": "boolean"}}}
INVOKE = scope("invoke")

routes = [
    ApiRoute("/v1/responses", create, "POST", Operation(
        "OpenAI Responses API on a deployment (typed SSE events when stream is true)", INVOKE,
        body=CREATE_BODY, response=OBJECT)),
    ApiRoute("/v1/responses/{response_id}", retrieve, "GET", Operation(
        "A stored response of the caller's", INVOKE, response=OBJECT)),
    ApiRoute("/v1/responses/{response_id}", delete, "DELETE", Operation(
        "Delete a stored response of the caller's", INVOKE, response=DELETED)),
]
