"""The batching loop of a function replica: items in, one predict per due batch, results out.

`FunctionWorker.submit(items)` queues each item in the `Batcher` with a future and
wakes the loop; the loop takes each due batch (full, or its oldest item at its
deadline: the batcher decides) and runs `run_batch` on one worker thread, so
predict calls never overlap (one model, one device) and the event loop keeps
accepting requests meanwhile. Each future gets its item's output and its share of
the batch's compute seconds, or the batch's `HandlerError`.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from runtime.functions.batcher import Batcher
from runtime.functions.handler import HandlerError

RunBatch = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


@dataclass(frozen=True)
class ItemResult:
    output: dict[str, Any]
    compute_s: float              # the batch's predict seconds / its item count
    batch_size: int


@dataclass
class QueuedItem:
    value: dict[str, Any]
    future: asyncio.Future[ItemResult]


@dataclass
class WorkerStats:
    requests: int = 0
    items: int = 0
    batches: int = 0
    failed_batches: int = 0
    compute_s: float = 0.0


class FunctionWorker:
    def __init__(self, run: RunBatch, batcher: Batcher[QueuedItem],
                 clock: Callable[[], float] = time.monotonic):
        self.run = run
        self.batcher = batcher
        self.clock = clock
        self.stats = WorkerStats()
        self._arrived = asyncio.Event()
        self._task: Optional[asyncio.Task[None]] = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def submit(self, items: tuple[dict[str, Any], ...]) -> list[ItemResult]:
        """Every item's result, in order; HandlerError when a batch holding one failed."""
        loop = asyncio.get_running_loop()
        queued = [QueuedItem(value, loop.create_future()) for value in items]
        now = self.clock()
        for item in queued:
            self.batcher.add(item, now)
        self.stats.requests += 1
        self._arrived.set()
        results = await asyncio.gather(*(item.future for item in queued), return_exceptions=True)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            raise failed
        return [r for r in results if isinstance(r, ItemResult)]

    async def _loop(self) -> None:
        while True:
            # an item whose caller left (its future cancelled) is not computed
            batch = [item for item in self.batcher.take(self.clock()) if not item.future.done()]
            if batch:
                await self._run(batch)
                continue
            if self.batcher.is_due(self.clock()):
                continue                   # only cancelled items were due
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), self.batcher.wait_s(self.clock()))
            except asyncio.TimeoutError:
                pass

    async def _run(self, batch: list[QueuedItem]) -> None:
        started = time.perf_counter()
        try:
            outputs = await asyncio.to_thread(self.run, [item.value for item in batch])
        except HandlerError as exc:
            self.stats.failed_batches += 1
            _fail(batch, exc)
            return
        except Exception as exc:  # noqa: BLE001 - a bug on our side must not leave callers hanging
            _fail(batch, HandlerError(f"{type(exc).__name__}: {exc}"))
            return
        seconds = time.perf_counter() - started
        self.stats.batches += 1
        self.stats.items += len(batch)
        self.stats.compute_s += seconds
        for item, output in zip(batch, outputs):
            if not item.future.done():
                item.future.set_result(ItemResult(output, seconds / len(batch), len(batch)))


def _fail(batch: list[QueuedItem], exc: HandlerError) -> None:
    for item in batch:
        if not item.future.done():
            item.future.set_exception(exc)
