"""Noticing a client that left, for both servers.

ASGI reports a disconnect only to whoever calls `receive`; a handler busy
waiting on the engine or on a replica would never see it. `until_disconnect`
races the work against the disconnect, cancels the work when the client goes
first, and waits for it to unwind, so its `finally` (an engine abort, a lease
release) has run when it returns.
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Optional, TypeVar

from wire.request_id import Receive  # ASGI's receive, as Starlette types it

__all__ = ["Receive", "until_disconnect", "wait_for_disconnect"]

T = TypeVar("T")


async def wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(receive: Receive, work: Awaitable[T]) -> Optional[T]:
    """`work`'s result, or None when the client disconnected first (work is cancelled)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, watch):
            pending.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
    return None if task.cancelled() else task.result()
