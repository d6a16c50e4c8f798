"""A chore the control plane repeats while it runs (aborting expired uploads): one task,
started and stopped by the lifespan; a round that fails is logged and the next one runs."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Awaitable, Callable, Optional

log = logging.getLogger("thawpool.periodic")


class Periodic:
    def __init__(self, name: str, every_s: float, work: Callable[[], Awaitable[object]]):
        self.name = name
        self.every_s = every_s
        self.work = work
        self._task: Optional[asyncio.Task[None]] = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                await self.work()
            except Exception as exc:  # noqa: BLE001 - the next round may succeed
                log.warning("%s failed: %r", self.name, exc)
            await asyncio.sleep(self.every_s)
