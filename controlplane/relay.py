"""Relaying a replica's SSE stream to the client, chunk by chunk, never buffered whole.

A plain ASGI app rather than StreamingResponse: it races every upstream read
against the client's disconnect, so a client that leaves closes the upstream
connection at once (the replica then aborts the request) and the tokens
delivered so far are billed as `partial`.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Awaitable, Callable, Optional

import httpx

log = logging.getLogger("thawpool.gateway")
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"),
               (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


async def wait_for_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(receive, work: Awaitable):
    """`work`'s result, or None when the client disconnected first (work is cancelled)."""
    watch = asyncio.ensure_future(wait_for_disconnect(receive))
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({watch, task}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        return None
    finally:
        watch.cancel()


class StreamRelay:
    """on_payload(dict) -> dict | None transforms each chunk; on_end(outcome) bills it.

    outcome is "done" ([DONE] seen), "client_gone" or "upstream_cut".
    """

    def __init__(self, upstream: httpx.Response, on_payload: Callable[[dict], Optional[dict]],
                 on_end: Callable[[str], Awaitable[None]], headers: list[tuple[bytes, bytes]]):
        self.upstream = upstream
        self.on_payload = on_payload
        self.on_end = on_end
        self.headers = SSE_HEADERS + headers

    async def __call__(self, scope, receive, send):
        watch = asyncio.ensure_future(wait_for_disconnect(receive))
        lines = self.upstream.aiter_lines()
        outcome, pending = "upstream_cut", None
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            while True:
                pending = asyncio.ensure_future(anext(lines))
                done, _ = await asyncio.wait({pending, watch},
                                             return_when=asyncio.FIRST_COMPLETED)
                if pending not in done:
                    outcome = "client_gone"
                    break
                try:
                    line = pending.result()
                except StopAsyncIteration:
                    break
                except httpx.HTTPError as exc:
                    log.warning("replica stream cut", extra={"error": repr(exc)})
                    await send(_event({"error": {"type": "upstream_error", "code": None,
                                                 "message": "the replica stream ended early"}}))
                    break
                if line == "data: [DONE]":
                    outcome = "done"
                    await send(_raw(b"data: [DONE]\n\n"))
                    continue
                if line.startswith("data: "):
                    payload = self.on_payload(json.loads(line[6:]))
                    if payload is not None:
                        await send(_event(payload))
            if outcome != "client_gone":
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watch.cancel()
            if pending is not None and not pending.done():
                pending.cancel()
            await _quietly(self.upstream.aclose())
            await self.on_end(outcome)


def _event(payload: dict) -> dict:
    return _raw(b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n")


def _raw(data: bytes) -> dict:
    return {"type": "http.response.body", "body": data, "more_body": True}


async def _quietly(awaitable) -> None:
    try:
        await awaitable
    except Exception:  # noqa: BLE001 - closing a broken stream may fail; nothing to do
        pass
