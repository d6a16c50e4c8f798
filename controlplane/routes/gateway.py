"""OpenAI-compatible invocation endpoints; the work is in controlplane.gateway."""
from __future__ import annotations

from starlette.requests import Request
from starlette.routing import Route


async def completions(request: Request):
    return await request.app.state.gateway.invoke(request, "completions")


async def chat_completions(request: Request):
    return await request.app.state.gateway.invoke(request, "chat/completions")


routes = [
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
]
