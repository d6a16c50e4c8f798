"""Drives a synchronous LLMEngine from one background thread for an asyncio server.

The engine is not thread-safe, so only the engine thread ever calls it. The
event loop hands over adds and aborts through a list guarded by a condition;
the thread applies them between steps, steps while work remains, and sleeps
on the condition when idle (no busy spin). Outputs of a step go back to the
loop in one `call_soon_threadsafe`, where each lands in its request's queue.
"""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import AsyncIterator, Optional, Protocol, Union

from runtime.outputs import EngineStats, RequestOutput
from runtime.sampling_params import SamplingParams


class Engine(Protocol):
    """The part of runtime.engine.LLMEngine this module drives."""
    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: SamplingParams) -> None: ...
    def abort_request(self, request_id: str) -> None: ...
    def step(self) -> list[RequestOutput]: ...
    def has_unfinished_requests(self) -> bool: ...
    def stats(self) -> EngineStats: ...


class EngineDead(RuntimeError):
    """The engine thread failed a step; requests that were in flight get this."""


@dataclass
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    done: asyncio.Future   # resolved on the loop: None, or the engine's ValueError


@dataclass
class _Abort:
    request_id: str


_Op = Union[_Add, _Abort]


@dataclass
class RequestStream:
    """The per-step deltas of one request. Leaving the `async with` early aborts it."""
    request_id: str
    _queue: asyncio.Queue
    _owner: "AsyncEngine"
    finished: bool = False

    async def __aenter__(self) -> "RequestStream":
        return self

    async def __aexit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Abort the request unless the engine already finished it."""
        if not self.finished:
            self._owner.abort(self.request_id)

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


@dataclass
class _Handoff:
    """State shared between the loop and the engine thread, always under `cond`."""
    cond: threading.Condition = field(default_factory=threading.Condition)
    ops: list[_Op] = field(default_factory=list)
    stopping: bool = False


class AsyncEngine:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._handoff = _Handoff()
        self._streams: dict[str, asyncio.Queue] = {}   # touched on the loop only
        self._reserved: set[str] = set()               # ids the engine may still hold (loop only)
        self._live: set[str] = set()                   # touched on the engine thread only
        self._stats: EngineStats = engine.stats()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self.error: Optional[BaseException] = None

    # ---------------------------------------------------------- loop side

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="engine-step-loop", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        with self._handoff.cond:
            self._handoff.stopping = True
            self._handoff.cond.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    @property
    def stats(self) -> EngineStats:
        """The snapshot taken after the latest step (reading it never races the engine)."""
        return self._stats

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    async def add(self, request_id: str, prompt_token_ids: list[int],
                  params: SamplingParams) -> RequestStream:
        """Queue a request; raises the engine's ValueError (too long, bad ids) if it refuses."""
        request_id = self._unique_id(request_id)
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = queue
        self._reserved.add(request_id)
        done = self._loop.create_future()
        self._submit(_Add(request_id, prompt_token_ids, params, done))
        try:
            await asyncio.shield(done)
        except ValueError:
            self._streams.pop(request_id, None)
            self._reserved.discard(request_id)   # refused: the engine never held it
            raise
        except BaseException:
            self.abort(request_id)   # the client left while we waited
            raise
        return RequestStream(request_id, queue, self)

    def abort(self, request_id: str) -> None:
        """Forget the request here; the engine frees its blocks at its next step."""
        if self._streams.pop(request_id, None) is not None:
            self._submit(_Abort(request_id))

    def abort_keeping_stream(self, request_id: str) -> None:
        if request_id in self._streams:
            self._submit(_Abort(request_id))

    def _unique_id(self, wanted: str) -> str:
        """Ids must be distinct in the engine, even from aborted ones not yet freed;
        a repeat gets a suffix."""
        candidate, n = wanted, 1
        while candidate in self._reserved:
            candidate, n = f"{wanted}-{n}", n + 1
        return candidate

    def _submit(self, op: _Op) -> None:
        with self._handoff.cond:
            self._handoff.ops.append(op)
            self._handoff.cond.notify()

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            if output.finished:
                self._reserved.discard(output.request_id)
            queue = self._streams.get(output.request_id)
            if queue is None:
                continue   # aborted on our side; its last delta has nobody to go to
            queue.put_nowait(output)
            if output.finished:
                del self._streams[output.request_id]

    def _fail(self, request_ids: list[str], error: BaseException) -> None:
        for request_id in request_ids:
            self._reserved.discard(request_id)
            queue = self._streams.pop(request_id, None)
            if queue is not None:
                queue.put_nowait(error)

    # ---------------------------------------------------------- engine thread

    def _run(self) -> None:
        while (ops := self._wait_for_work()) is not None:
            aborted = self._apply(ops)
            # An abort frees blocks at the next step, so step even if nothing else runs.
            if aborted or self.engine.has_unfinished_requests():
                self._step()
            self._stats = self.engine.stats()

    def _wait_for_work(self) -> Optional[list[_Op]]:
        handoff = self._handoff
        with handoff.cond:
            while not (handoff.ops or handoff.stopping or self.engine.has_unfinished_requests()):
                handoff.cond.wait()
            if handoff.stopping:
                return None
            ops, handoff.ops = handoff.ops, []
            return ops

    def _apply(self, ops: list[_Op]) -> bool:
        aborted = False
        for op in ops:
            if isinstance(op, _Add):
                self._apply_add(op)
            elif op.request_id in self._live:
                self._live.discard(op.request_id)
                self.engine.abort_request(op.request_id)
                aborted = True
        return aborted

    def _apply_add(self, op: _Add) -> None:
        try:
            self.engine.add_request(op.request_id, op.prompt_token_ids, op.params)
        except ValueError as exc:
            self._loop.call_soon_threadsafe(_resolve, op.done, exc)
            return
        self._live.add(op.request_id)
        self._loop.call_soon_threadsafe(_resolve, op.done, None)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as exc:   # noqa: BLE001 - every in-flight request must hear of it
            self._fail_everything(exc)
            return
        self._live.difference_update(o.request_id for o in outputs if o.finished)
        if outputs:
            self._loop.call_soon_threadsafe(self._deliver, outputs)

    def _fail_everything(self, exc: Exception) -> None:
        self.error = exc
        failed = sorted(self._live)
        for request_id in failed:
            self.engine.abort_request(request_id)
        self._live.clear()
        error = EngineDead(f"engine step failed: {exc!r}")
        self._loop.call_soon_threadsafe(self._fail, failed, error)


def _resolve(future: asyncio.Future, error: Optional[BaseException]) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
