"""Noticing a client that left, for both servers.

ASGI reports a disconnect only to whoever calls `receive`; a handler busy
waiting on the engine or on a replica would never see it. `until_disconnect`
races the work against the disconnect, cancels the work when the client goes
first, and waits for it to unwind, so its `finally` (an engine abort, a lease
release) has run when it returns.
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Optional, TypeVar

from wire.request_id import Receive  # ASGI's receive, as Starlette types it

__all__ = ["Receive", "until_disconnect", "wait_for_disconnect"]

T = TypeVar("T")


async def wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(receive: Receive, work: Awaitable[T], *,
                           watch_after_s: float = 0.0) -> Optional[T]:
    """`work`'s result, or None when the client disconnected first (work is cancelled).

    `work` runs in the caller's task; only the watch is a task of its own, and a
    disconnect cancels the caller's task, which this function then uncancels. With
    `watch_after_s`, the watch starts only once the work has run that long: work done
    sooner costs no task at all, and a client that left meanwhile is noticed then."""
    current = asyncio.current_task()
    assert current is not None, "until_disconnect runs inside a task"
    state = _Watch()

    def on_disconnect(watched: asyncio.Future[None]) -> None:
        # not after `work` finished: a callback already scheduled then must not cancel
        # whatever the caller awaits next
        if not state.finished and not watched.cancelled() and watched.exception() is None:
            state.gone = True
            current.cancel()

    def start_watch() -> None:
        if not state.finished:
            state.watch = asyncio.ensure_future(wait_for_disconnect(receive))
            state.watch.add_done_callback(on_disconnect)

    timer = (asyncio.get_running_loop().call_later(watch_after_s, start_watch)
             if watch_after_s > 0 else None)
    if timer is None:
        start_watch()
    try:
        result = await work
    except asyncio.CancelledError:
        # ours alone (the caller did not cancel too): the client left
        if state.gone and current.uncancel() == 0:
            return None
        raise
    finally:
        state.finished = True
        if timer is not None:
            timer.cancel()
        state.stop(on_disconnect)
    if state.gone:                       # `work` swallowed our cancellation
        current.uncancel()
        return None
    return result


class _Watch:
    __slots__ = ("gone", "finished", "watch")

    def __init__(self) -> None:
        self.gone = False
        self.finished = False
        self.watch: Optional[asyncio.Future[None]] = None

    def stop(self, callback: Callable[[asyncio.Future[None]], None]) -> None:
        watch = self.watch
        if watch is None:
            return
        watch.remove_done_callback(callback)
        if watch.done() and not watch.cancelled():
            watch.exception()            # retrieved: a receive that failed is not logged
        watch.cancel()
