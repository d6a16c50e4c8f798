"""The one hand-off between the asyncio loop and a synchronous LLMEngine.

LLMEngine is not thread-safe; only the engine thread started here calls it.
The loop queues adds and aborts in a list guarded by a condition; the thread
applies them between steps, steps while work remains, and sleeps on the
condition when idle (no busy spin). Outputs of a step go back to the loop in
one `call_soon_threadsafe`, where each lands in its request's queue.

Request ids live in two places, each with one owner:
- `AsyncEngine._requests` (a `RequestTable`), on the loop: every id the engine may
  still hold, from `add` until the engine reports it finished, with the queue of
  whoever reads its outputs (None once the reader left and the abort is on its way).
  A repeated id gets a suffix while the first one is in here.
- the LLMEngine's scheduler, on the engine thread: the requests it runs.
"""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Optional, Protocol, TypeVar, Union

from runtime.engine.outputs import EngineStats, RequestOutput
from runtime.engine.request import sample_ids
from wire.sampling import SamplingParams


class Engine(Protocol):
    """The part of runtime.engine.llm_engine.LLMEngine this module drives."""
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


class EngineFrontend(Protocol):
    """What the serving code (openai_serving, embedding_serving) calls: AsyncEngine over
    an engine in this process, or runtime.serve.engine_client.EngineClient over an engine-core
    process."""
    async def add(self, request_id: str, prompt_token_ids: list[int],
                  params: SamplingParams) -> "RequestStream": ...
    async def add_samples(self, request_id: str, prompt_token_ids: list[int],
                          params: SamplingParams) -> list["RequestStream"]: ...


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
    the reader left and the abort is on its way). Loop-only; shared by both front ends,
    each of which hands the engine an abort its own way (`send_abort`)."""

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
        self._requests = RequestTable(lambda request_id: self._submit(_Abort(request_id)))
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
        return self._requests.num_in_flight

    async def add(self, request_id: str, prompt_token_ids: list[int],
                  params: SamplingParams) -> RequestStream:
        """Queue a request; raises the engine's ValueError (too long, bad ids) if it refuses."""
        return (await self.add_samples(request_id, prompt_token_ids, params))[0]

    async def add_samples(self, request_id: str, prompt_token_ids: list[int],
                          params: SamplingParams) -> list[RequestStream]:
        """Like `add`, with one stream per sample (params.n of them, the first the leader's)."""
        streams = self._requests.open(request_id, params.n)
        done: asyncio.Future[None] = self._running_loop().create_future()
        self._submit(_Add(streams[0].request_id, prompt_token_ids, params, done))
        await added(done, streams)
        return streams

    async def call(self, work: Callable[[], T]) -> T:
        """Run `work` on the engine thread between two steps (nothing else touches the
        engine meanwhile) and return its result or raise its exception."""
        done: asyncio.Future[T] = self._running_loop().create_future()
        self._submit(_Call(work, done))
        return await done

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
            self._requests.forget(sample_ids(op.request_id, op.params.n))
        settle(op.done, None, error)

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
        self._running_loop().call_soon_threadsafe(settle, op.done, result, error)

    def _step(self) -> None:
        try:
            outputs = self.llm_engine.step()
        except Exception as exc:   # noqa: BLE001 - every in-flight request must hear of it
            self._fail_everything(exc)
            return
        if outputs:
            self._running_loop().call_soon_threadsafe(self._requests.deliver, outputs)

    def _fail_everything(self, exc: Exception) -> None:
        self.error = exc
        failed = self.llm_engine.unfinished_request_ids()
        for request_id in failed:
            self.llm_engine.abort_request(request_id)
        error = EngineDead(f"engine step failed: {exc!r}")
        self._running_loop().call_soon_threadsafe(self._requests.fail, failed, error)


async def added(done: "asyncio.Future[None]", streams: list[RequestStream]) -> None:
    """Wait for the engine to take a request: its ValueError (the table already forgot the
    ids), or, if the caller leaves meanwhile, every sample aborted."""
    try:
        await asyncio.shield(done)
    except ValueError:
        raise
    except BaseException:
        for stream in streams:
            stream.close()   # the client left while we waited
        raise


def settle(done: "asyncio.Future[Any]", result: Any, error: Optional[BaseException]) -> None:
    if done.done():               # its caller left
        return
    if error is None:
        done.set_result(result)
    else:
        done.set_exception(error)
