"""The one hand-off between the asyncio loop and a synchronous LLMEngine.

LLMEngine is not thread-safe; only the engine thread started here calls it.
The loop queues adds and aborts in a list guarded by a condition; the thread
applies them between steps, steps while work remains, and sleeps on the
condition when idle (no busy spin). Outputs of a step go back to the loop in
one `call_soon_threadsafe`, where each lands in its request's queue.

Request ids live in two places, each with one owner:
- `AsyncEngine._requests`, on the loop: every id the engine may still hold,
  from `add` until the engine reports it finished, with the queue of whoever
  reads its outputs (None once the reader left and the abort is on its way).
  A repeated id gets a suffix while the first one is in here.
- the LLMEngine's scheduler, on the engine thread: the requests it runs.
"""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Optional, Protocol, TypeVar, Union

from runtime.outputs import EngineStats, RequestOutput
from runtime.request import sample_ids
from wire.sampling import SamplingParams


class Engine(Protocol):
    """The part of runtime.engine.LLMEngine this module drives."""
    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: SamplingParams) -> None: ...
    def abort_request(self, request_id: str) -> None: ...
    def step(self) -> list[RequestOutput]: ...
    def has_unfinished_requests(self) -> bool: ...
    def unfinished_request_ids(self) -> list[str]: ...
    def stats(self) -> EngineStats: ...


class EngineDead(RuntimeError):
    """The engine thread failed a step; requests that were in flight get this."""


Delivery = Union[RequestOutput, BaseException]   # what a request's queue carries
T = TypeVar("T")


@dataclass
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    done: "asyncio.Future[None]"   # resolved on the loop: None, or the engine's ValueError


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Call:
    work: Callable[[], Any]        # run on the engine thread, between steps
    done: "asyncio.Future[Any]"


_Op = Union[_Add, _Abort, _Call]


@dataclass
class RequestStream:
    """The per-step deltas of one request. Leaving the `async with` early aborts it."""
    request_id: str
    _queue: "asyncio.Queue[Delivery]"
    _owner: "AsyncEngine"
    finished: bool = False

    async def __aenter__(self) -> "RequestStream":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
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
    def __init__(self, llm_engine: Engine):
        self.llm_engine = llm_engine
        self.error: Optional[BaseException] = None   # set by the engine thread on a failed step
        self._handoff = _Handoff()
        self._requests: dict[str, Optional[asyncio.Queue[Delivery]]] = {}   # the loop's only
        self._stats: EngineStats = llm_engine.stats()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None

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
        """Requests someone is still reading."""
        return sum(queue is not None for queue in self._requests.values())

    async def add(self, request_id: str, prompt_token_ids: list[int],
                  params: SamplingParams) -> RequestStream:
        """Queue a request; raises the engine's ValueError (too long, bad ids) if it refuses."""
        return (await self.add_samples(request_id, prompt_token_ids, params))[0]

    async def add_samples(self, request_id: str, prompt_token_ids: list[int],
                          params: SamplingParams) -> list[RequestStream]:
        """Like `add`, with one stream per sample (params.n of them, the first the leader's)."""
        ids = self._unique_ids(request_id, params.n)
        queues: list[asyncio.Queue[Delivery]] = [asyncio.Queue() for _ in ids]
        self._requests.update(zip(ids, queues))
        done: asyncio.Future[None] = self._running_loop().create_future()
        self._submit(_Add(ids[0], prompt_token_ids, params, done))
        try:
            await asyncio.shield(done)
        except ValueError:
            raise   # `_added` already forgot them
        except BaseException:
            for sample_id in ids:
                self.abort(sample_id)   # the client left while we waited
            raise
        return [RequestStream(i, q, self) for i, q in zip(ids, queues)]

    async def call(self, work: Callable[[], T]) -> T:
        """Run `work` on the engine thread between two steps (nothing else touches the
        engine meanwhile) and return its result or raise its exception."""
        done: asyncio.Future[T] = self._running_loop().create_future()
        self._submit(_Call(work, done))
        return await done

    def abort(self, request_id: str) -> None:
        """Stop reading the request; the engine ends it and frees its blocks at its next step."""
        if self._requests.get(request_id) is not None:
            self._requests[request_id] = None
            self._submit(_Abort(request_id))

    def abort_keeping_stream(self, request_id: str) -> None:
        if self._requests.get(request_id) is not None:
            self._submit(_Abort(request_id))

    def _unique_ids(self, wanted: str, num_samples: int) -> list[str]:
        """Ids must be distinct in the engine, even from aborted ones not yet freed;
        a repeat gets a suffix. The ids of a request's samples follow from its own."""
        candidate, n = wanted, 1
        while any(i in self._requests for i in sample_ids(candidate, num_samples)):
            candidate, n = f"{wanted}-{n}", n + 1
        return sample_ids(candidate, num_samples)

    def _submit(self, op: _Op) -> None:
        with self._handoff.cond:
            self._handoff.ops.append(op)
            self._handoff.cond.notify()

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("AsyncEngine.start() was not called")
        return self._loop

    def _added(self, op: _Add, error: Optional[ValueError]) -> None:
        if error is not None:   # refused: the engine never held it, nor its samples
            for sample_id in sample_ids(op.request_id, op.params.n):
                self._requests.pop(sample_id, None)
        if op.done.done():
            return
        if error is None:
            op.done.set_result(None)
        else:
            op.done.set_exception(error)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            queue = self._requests.get(output.request_id)
            if output.finished:
                self._requests.pop(output.request_id, None)
            if queue is not None:   # None: aborted on our side, nobody reads it
                queue.put_nowait(output)

    def _fail(self, request_ids: list[str], error: BaseException) -> None:
        for request_id in request_ids:
            queue = self._requests.pop(request_id, None)
            if queue is not None:
                queue.put_nowait(error)

    # ---------------------------------------------------------- engine thread

    def _run(self) -> None:
        while (ops := self._wait_for_work()) is not None:
            for op in ops:
                self._apply(op)
            if self.llm_engine.has_unfinished_requests():   # an abort counts: it needs a step
                self._step()
            self._stats = self.llm_engine.stats()

    def _wait_for_work(self) -> Optional[list[_Op]]:
        handoff = self._handoff
        with handoff.cond:
            while not (handoff.ops or handoff.stopping
                       or self.llm_engine.has_unfinished_requests()):
                handoff.cond.wait()
            if handoff.stopping:
                return None
            ops, handoff.ops = handoff.ops, []
            return ops

    def _apply(self, op: _Op) -> None:
        if isinstance(op, _Call):
            self._run_call(op)
            return
        if isinstance(op, _Abort):
            self.llm_engine.abort_request(op.request_id)   # ignored if it finished meanwhile
            return
        error: Optional[ValueError] = None
        try:
            self.llm_engine.add_request(op.request_id, op.prompt_token_ids, op.params)
        except ValueError as exc:
            error = exc
        self._running_loop().call_soon_threadsafe(self._added, op, error)

    def _run_call(self, op: _Call) -> None:
        try:
            result, error = op.work(), None
        except Exception as exc:  # noqa: BLE001 - handed to whoever awaits the call
            result, error = None, exc
        self._running_loop().call_soon_threadsafe(_settle, op.done, result, error)

    def _step(self) -> None:
        try:
            outputs = self.llm_engine.step()
        except Exception as exc:   # noqa: BLE001 - every in-flight request must hear of it
            self._fail_everything(exc)
            return
        if outputs:
            self._running_loop().call_soon_threadsafe(self._deliver, outputs)

    def _fail_everything(self, exc: Exception) -> None:
        self.error = exc
        failed = self.llm_engine.unfinished_request_ids()
        for request_id in failed:
            self.llm_engine.abort_request(request_id)
        error = EngineDead(f"engine step failed: {exc!r}")
        self._running_loop().call_soon_threadsafe(self._fail, failed, error)


def _settle(done: "asyncio.Future[Any]", result: Any, error: Optional[BaseException]) -> None:
    if done.done():               # its caller left
        return
    if error is None:
        done.set_result(result)
    else:
        done.set_exception(error)
