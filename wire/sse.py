"""Server-sent events: framing, and a response that streams them to a client that may leave.

`EventStreamResponse` is a plain ASGI app rather than Starlette's
StreamingResponse, which sees a disconnect only when a send fails and leaves
the generator to the garbage collector. Here every wait for the next event is
raced against the client's disconnect, and the source is closed at once, so
its `finally` (an engine abort in the replica, closing the upstream stream and
billing in the control plane) runs when the client goes.
"""
from __future__ import annotations

import json
from contextlib import aclosing
from typing import Any, AsyncGenerator, Awaitable, Callable, Optional, Sequence, Union

from wire.disconnect import until_disconnect
from wire.request_id import Receive, Scope, Send

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"),
               (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
DONE_LINE = "data: [DONE]"


def sse(data: Union[dict[str, Any], str]) -> bytes:
    """One event: `data: <json>` and a blank line."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


SSE_DONE = sse("[DONE]")


def data_of(line: str) -> Optional[dict[str, Any]]:
    """The JSON payload of one `data:` line; None for [DONE], comments and blank lines."""
    if not line.startswith("data: ") or line == DONE_LINE:
        return None
    payload = json.loads(line[6:])
    return payload if isinstance(payload, dict) else None


class EventStreamResponse:
    """Streams `events`; `on_close(completed)` always runs, with completed False when the
    client left before the last event (or the events never started)."""

    def __init__(self, events: AsyncGenerator[bytes, None],
                 on_close: Callable[[bool], Awaitable[None]],
                 headers: Sequence[tuple[bytes, bytes]] = ()):
        self.events = events
        self.on_close = on_close
        self.headers = [*SSE_HEADERS, *headers]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        completed = False
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            async with aclosing(self.events):
                completed = bool(await until_disconnect(receive, self._pump(send)))
        finally:
            await self.on_close(completed)
        if completed:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pump(self, send: Send) -> bool:
        try:
            async for event in self.events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
        except OSError:   # the socket went away mid-send
            return False
        return True
