"""The pool's background tasks: started from synchronous decisions, awaited at stop.

A decision (scale down, fail, drain) runs between awaits and cannot await its I/O;
it spawns it here, and stop() waits for what is still running so no stop or
cleanup is cut short.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Coroutine

Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]


class BackgroundTasks:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def wait(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)
