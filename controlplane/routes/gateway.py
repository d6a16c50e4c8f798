"""OpenAI-compatible invocation: POST /v1/completions and /v1/chat/completions."""
from __future__ import annotations

from typing import Union

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from controlplane.routes.context import app_state, read_json, request_id, require
from wire.sse import EventStreamResponse

Answer = Union[Response, EventStreamResponse]


async def invoke(request: Request, endpoint: str) -> Answer:
    """One invocation, in order: auth → resolve → validate → acquire → relay → meter.

    Everything that can refuse the request (auth, an unknown deployment, a bad field,
    the rate limit) does so before a replica is acquired, so a refused request wakes
    nothing and writes no usage row."""
    gateway = app_state(request).gateway
    principal = require(request, "invoke")                                    # auth
    body = await read_json(request)
    target = await gateway.resolve(principal, body, request_id(request))      # resolve
    invocation = gateway.validate(endpoint, body, target)                     # validate
    gateway.admit(principal, invocation)
    call = await gateway.acquire(principal, target, invocation,               # acquire
                                 request_id(request), endpoint)
    upstream = await gateway.send(call, body)                                 # relay
    if invocation.request.stream and upstream.status_code == 200:
        # relay and meter: the stream meters itself when it closes (done, client gone, cut)
        return gateway.relay_stream(call, upstream, invocation.request.stream_options)
    response, outcome = await gateway.relay_unary(call, upstream, request.receive)
    await gateway.meter(call, outcome)                                        # meter
    return response


async def completions(request: Request) -> Answer:
    return await invoke(request, "completions")


async def chat_completions(request: Request) -> Answer:
    return await invoke(request, "chat/completions")


routes = [
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
]
