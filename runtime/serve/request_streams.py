"""The event loop's side of the requests the engine core holds
(runtime/serve/engine_client.py): one `RequestStream` per request, which its reader
iterates and leaves, and the `RequestTable` of every id the core may still hold.

Request ids live in two places, each with one owner:
- the client's `RequestTable`, on the loop: every id the core may still hold, from `add`
  until the core reports it finished, with the queue of whoever reads its outputs (None
  once the reader left and the abort is on its way). A repeated id gets a suffix while
  the first one is in here.
- the LLMEngine's scheduler, in the engine-core process: the requests it runs.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Optional, Union

from runtime.engine.outputs import RequestOutput
from runtime.engine.request import sample_ids


class EngineDead(RuntimeError):
    """The engine failed a step, or its core process died; requests in flight get this."""


Delivery = Union[RequestOutput, BaseException]   # what a request's queue carries


@dataclass
class RequestStream:
    """The per-step deltas of one request. Leaving the `async with` early aborts it."""
    request_id: str
    _queue: "asyncio.Queue[Delivery]"
    _owner: "RequestTable"
    finished: bool = False

    async def __aenter__(self) -> "RequestStream":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """Abort the request unless the engine already finished it."""
        if not self.finished:
            self._owner.abort(self.request_id)

    @property
    def backlog(self) -> int:
        """Outputs that arrived and wait for the reader."""
        return self._queue.qsize()

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        while not self.finished:
            yield await self._next()

    async def _next(self) -> RequestOutput:
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self.finished = True   # the engine already dropped it
            raise item
        self.finished = item.finished
        return item

    async def cancel(self) -> RequestOutput:
        """Abort and wait for the engine's last word on it (one step), which carries its metrics.

        Deltas that arrive meanwhile were never shown to the client and are dropped.
        """
        self._owner.abort_keeping_stream(self.request_id)
        while True:
            output = await self._next()
            if output.finished:
                return output


class RequestTable:
    """The loop's record of every id the engine may still hold, from `open` until the
    engine reports it finished, with the queue of whoever reads its outputs (None once
    the reader left and the abort is on its way). Loop-only; `send_abort` hands the
    engine an abort."""

    def __init__(self, send_abort: Callable[[str], None]) -> None:
        self._send_abort = send_abort
        self._queues: dict[str, Optional[asyncio.Queue[Delivery]]] = {}

    @property
    def num_in_flight(self) -> int:
        """Requests someone is still reading."""
        return sum(queue is not None for queue in self._queues.values())

    @property
    def num_undelivered(self) -> int:
        """Outputs waiting in queues for their readers."""
        return sum(queue.qsize() for queue in self._queues.values() if queue is not None)

    def open(self, wanted: str, num_samples: int) -> list[RequestStream]:
        """Streams for a request's samples, under ids distinct from every id the engine may
        hold (even aborted ones not yet freed): a repeat gets a suffix. The ids of a
        request's samples follow from its own."""
        candidate, n = wanted, 1
        while any(i in self._queues for i in sample_ids(candidate, num_samples)):
            candidate, n = f"{wanted}-{n}", n + 1
        ids = sample_ids(candidate, num_samples)
        queues: list[asyncio.Queue[Delivery]] = [asyncio.Queue() for _ in ids]
        self._queues.update(zip(ids, queues))
        return [RequestStream(i, q, self) for i, q in zip(ids, queues)]

    def abort(self, request_id: str) -> None:
        """Stop reading the request; the engine ends it and frees its blocks at its next step."""
        if self.stop_reading(request_id):
            self._send_abort(request_id)

    def abort_keeping_stream(self, request_id: str) -> None:
        """End it in the engine, still reading its last output (which carries its metrics)."""
        if self.is_read(request_id):
            self._send_abort(request_id)

    def is_read(self, request_id: str) -> bool:
        return self._queues.get(request_id) is not None

    def stop_reading(self, request_id: str) -> bool:
        """True if someone was reading it (the engine must hear of the abort)."""
        if not self.is_read(request_id):
            return False
        self._queues[request_id] = None
        return True

    def forget(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._queues.pop(request_id, None)

    def deliver(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            queue = self._queues.get(output.request_id)
            if output.finished:
                self._queues.pop(output.request_id, None)
            if queue is not None:   # None: aborted on our side, nobody reads it
                queue.put_nowait(output)

    def fail(self, request_ids: list[str], error: BaseException) -> None:
        for request_id in request_ids:
            queue = self._queues.pop(request_id, None)
            if queue is not None:
                queue.put_nowait(error)

    def fail_all(self, error: BaseException) -> None:
        self.fail(list(self._queues), error)

