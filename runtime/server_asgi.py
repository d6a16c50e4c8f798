"""Plain ASGI pieces of the replica server, no Starlette base classes.

`RequestIdMiddleware` gives every request an id (the client's X-Request-Id or
a fresh one) and echoes it on every response. `EventStreamResponse` streams
SSE and notices a client that leaves even while no token is due, so the
engine request is aborted at once. `until_disconnect` does the same for a
non-streaming request.
"""
from __future__ import annotations

import asyncio
import uuid
from contextlib import aclosing
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = b"x-request-id"
_MAX_REQUEST_ID_LEN = 128


class RequestIdMiddleware:
    """Takes the client's X-Request-Id (or makes one), exposes it, echoes it on every response."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _client_request_id(scope) or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0] != REQUEST_ID_HEADER]
                message["headers"] = headers + [(REQUEST_ID_HEADER, request_id.encode())]
            await send(message)

        await self.app(scope, receive, send_with_id)


def _client_request_id(scope: Scope) -> Optional[str]:
    for name, value in scope.get("headers", []):
        if name == REQUEST_ID_HEADER:
            text = value.decode("latin-1").strip()
            # Only ids that are safe to log and to echo in a header are kept.
            if 0 < len(text) <= _MAX_REQUEST_ID_LEN and text.isprintable() and text.isascii():
                return text
    return None


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(receive: Receive, work: Awaitable[Any]) -> Optional[Any]:
    """Run `work`; cancel it if the client goes away first (then return None)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, watch):
            pending.cancel()
        # Wait for both to unwind so the work's `finally` (an abort) has run when we return.
        await asyncio.gather(task, watch, return_exceptions=True)
    return None if task.cancelled() else task.result()


class EventStreamResponse:
    """SSE that notices a client leaving even while no token is due, and always closes its source.

    Starlette's StreamingResponse only sees a disconnect when a send fails
    (ASGI 2.4), and leaves the generator to the garbage collector; here the
    generator's `finally` (which aborts the engine request) runs at once.
    """

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]]):
        self.events = events
        self.on_close = on_close   # runs even if the events never started

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]})
        try:
            async with aclosing(self.events):
                finished = await until_disconnect(receive, self._pump(send))
        finally:
            await self.on_close()
        if finished:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pump(self, send: Send) -> bool:
        try:
            async for event in self.events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
        except OSError:   # the socket went away mid-send
            return False
        return True
