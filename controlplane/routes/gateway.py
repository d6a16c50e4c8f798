"""OpenAI-compatible invocation: POST /v1/completions, /v1/chat/completions and
/v1/embeddings (a deployment with engine task "embed"; billed per input token)."""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Union

from starlette.requests import Request
from starlette.responses import Response

from controlplane.gateway.answer_shape import ChatShape
from controlplane.gateway.fallbacks import ClientRequest, first_answer
from controlplane.routes.api import OBJECT, ApiRoute, Operation, scope
from controlplane.routes.context import app_state, read_json, request_id, require
from wire.request_id import Receive, Scope, Send, access_fields
from wire.priority import HIGHEST, LOWEST
from wire.sse import EventStreamResponse

GatewayResponse = Union[Response, EventStreamResponse, "MeteredResponse"]


async def invoke(request: Request, endpoint: str) -> GatewayResponse:
    """One invocation, in order: auth → resolve → validate → admit → reserve → acquire →
    relay → meter.

    Everything that can refuse the request (auth, an unknown deployment, a bad field,
    the rate limit, a spend budget) does so before a replica is acquired, so a refused
    request wakes nothing and writes no usage row. Acquire and send go to the deployment's
    fallbacks in turn when it cannot answer (controlplane.gateway.fallbacks)."""
    gateway = app_state(request).gateway
    principal = require(request, "invoke")                                    # auth
    body = await read_json(request)
    target = await gateway.resolve(principal, body, request_id(request))      # resolve
    invocation = gateway.validate(endpoint, body, target)                     # validate
    priority = gateway.priority(principal, invocation)                        # the key's range
    admission = gateway.admit(principal, target, invocation)                  # rate limits
    hold = await gateway.reserve(principal, target, invocation, admission)    # budgets
    client = ClientRequest(principal, body, request_id(request), endpoint, access_fields(request.scope),
                           lambda other: gateway.validate(endpoint, body, other), priority=priority)
    answer = await first_answer(gateway, client, target, invocation, admission, hold)   # acquire, send
    call, upstream, invocation = answer.call, answer.upstream, answer.invocation      # relay
    if invocation.request.stream and upstream.status_code == 200:
        # relay and meter: the stream meters itself when it closes (done, client gone, cut)
        return gateway.relay_stream(call, upstream,
                                    ChatShape(call.target.model_name, invocation.request.stream_options))
    response, outcome = await gateway.relay_unary(call, upstream, request.receive, ChatShape(call.target.model_name))
    gateway.release(call)        # the replica is done: a slow reader does not hold it
    return MeteredResponse(response, lambda: gateway.meter(call, outcome))   # meter


class MeteredResponse:
    """`response`, then `meter()` whatever became of the send: the call is metered once its
    answer is in the client's connection, off the call's latency (journal writes, metrics
    and a log line) but still inside the request, which a graceful shutdown
    waits for (the replica itself was given back before the send). A control plane killed
    between the two bills the call as it bills a stream cut after its last chunk (B-CP-3,
    docs/billing-guarantees.md)."""

    def __init__(self, response: Response, meter: Callable[[], Awaitable[None]]):
        self.response, self.meter = response, meter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.response(scope, receive, send)
            await asyncio.sleep(0)    # uvloop puts the queued answer into the kernel at the turn's end
        finally:
            await self.meter()


async def completions(request: Request) -> GatewayResponse:
    return await invoke(request, "completions")


async def chat_completions(request: Request) -> GatewayResponse:
    return await invoke(request, "chat/completions")


async def embeddings(request: Request) -> GatewayResponse:
    return await invoke(request, "embeddings")


MODEL = {"type": "string", "description": "the deployment name"}
PRIORITY = {"type": "integer", "minimum": LOWEST, "maximum": HIGHEST,
            "description": "lower runs first (0: interactive, the default; 100: batch); within "
                           "the range the API key allows"}
COMPLETION_BODY = {"type": "object", "required": ["model", "prompt"], "properties": {
    "model": MODEL, "prompt": {"anyOf": [{"type": "string"},
                                         {"type": "array", "items": {"type": "integer"}}]},
    "max_tokens": {"type": "integer", "minimum": 1}, "stream": {"type": "boolean"},
    "priority": PRIORITY}}
CHAT_BODY = {"type": "object", "required": ["model", "messages"], "properties": {
    "model": MODEL, "messages": {"type": "array", "items": {
        "type": "object", "required": ["role"],
        "properties": {"role": {"type": "string"}, "content": {"type": ["string", "array", "null"]},
                       "tool_calls": {"type": "array"}, "tool_call_id": {"type": "string"}}}},
    "max_tokens": {"type": "integer", "minimum": 1}, "stream": {"type": "boolean"},
    "tools": {"type": "array", "items": {"type": "object"}},
    "tool_choice": {"anyOf": [{"type": "string", "enum": ["none", "auto", "required"]},
                              {"type": "object"}]}, "priority": PRIORITY}}
EMBEDDING_BODY = {"type": "object", "required": ["model", "input"], "properties": {
    "model": MODEL, "input": {"anyOf": [
        {"type": "string"}, {"type": "array", "items": {"type": "string"}},
        {"type": "array", "items": {"type": "integer"}},
        {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}]},
    "encoding_format": {"type": "string", "enum": ["float", "base64"]}, "priority": PRIORITY}}
INVOKE = scope("invoke")

routes = [
    ApiRoute("/v1/completions", completions, "POST", Operation(
        "OpenAI completions on a deployment (SSE when stream is true)", INVOKE,
        body=COMPLETION_BODY, response=OBJECT)),
    ApiRoute("/v1/chat/completions", chat_completions, "POST", Operation(
        "OpenAI chat completions on a deployment (SSE when stream is true)", INVOKE,
        body=CHAT_BODY, response=OBJECT)),
    ApiRoute("/v1/embeddings", embeddings, "POST", Operation(
        "OpenAI embeddings on a deployment whose engine task is \"embed\"", INVOKE,
        body=EMBEDDING_BODY, response=OBJECT)),
]
