"""The server's side of the engine-core process (runtime/serve/engine_core.py):
`EngineClient` is what the serving code (runtime/serve/completions.py, embeddings.py)
adds requests to and ModelHost starts, sleeps, wakes and stops, over one pipe read by
the event loop itself (no thread).

- Out: every add, abort and call of one loop turn goes as one message.
- In: one StepBatch per step of the core; its deltas land in the requests' queues
  (runtime/serve/request_streams.py); detokenization happens here, in the readers.
- Back-pressure: when more than MAX_UNDELIVERED outputs wait in queues for their
  readers, the loop stops reading the pipe until they drain; the pipe fills and the
  core blocks on its next send. What this process buffers is bounded.
- Death: the core's exit (its sentinel, watched by the loop) fails every request in
  flight with EngineDead, sets `error`, and calls `on_death` (ModelHost ends the
  replica, as for a dead tensor-parallel worker). A clean stop closes the pipe: the core
  exits at its end.
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import multiprocessing as mp
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, TypeVar

from runtime.serve.engine_core import (AbortOp, AddOp, CallOp, Engine, EngineInfo, Load, Loaded,
                                       LoadFailed, Op, StepBatch, Warmed, install_lora, remove_lora,
                                       run_core, sleep_engine, wake_engine)
from runtime.serve.request_streams import EngineDead, RequestStream, RequestTable
from runtime.load.timings import LoadTimings
from runtime.engine.outputs import EngineStats
from runtime.engine.request import sample_ids
from runtime.core.sleep_mode import Freed
from wire.sampling import SamplingParams

if TYPE_CHECKING:
    from runtime.lora.adapter import LoraAdapter
    from wire.replica_control import LoadRequest

MAX_UNDELIVERED = 65536   # outputs queued for readers before the core is made to wait
RESUME_CHECK_S = 0.005    # how often a paused reader looks whether the queues drained
STOP_TIMEOUT_S = 15.0     # a core that does not exit at the pipe's close is killed
REAP_TIMEOUT_S = 1.0      # for its exit status, once it has closed its end
T = TypeVar("T")


class CoreLoadFailed(RuntimeError):
    """The engine-core process could not load the model (or died while loading)."""


class Core(Protocol):
    """Where the core's step loop runs, as the client watches it: its process (a
    multiprocessing process is one), or in tests a thread of this one."""

    @property
    def pid(self) -> Optional[int]: ...

    @property
    def sentinel(self) -> int:
        """A file descriptor that turns readable when the core has ended."""

    @property
    def exitcode(self) -> Optional[int]: ...

    def join(self, timeout: Optional[float] = None) -> None: ...

    def kill(self) -> None: ...


class EngineClient:
    def __init__(self, process: Core, conn: Connection, loaded: Loaded,
                 on_death: Callable[[str], None]):
        self.info: EngineInfo = loaded.info
        self.error: Optional[BaseException] = None
        self._process, self._conn = process, conn
        self._worker_pids = loaded.worker_pids
        self._on_death = on_death
        self._requests = RequestTable(lambda request_id: self._send(AbortOp(request_id)))
        self._stats = loaded.stats
        self._outbox: list[Op] = []
        self._adds: dict[str, tuple[asyncio.Future[None], int]] = {}   # leader id -> done, n
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count()
        self._stopping = False
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(conn.fileno(), self._on_readable)
        self._loop.add_reader(process.sentinel, self._on_exit)

    @classmethod
    async def start(cls, request: "LoadRequest", on_death: Callable[[str], None],
                    core: Optional["CoreProcess"] = None) -> "EngineClient":
        """Load `request` in `core` (a standby's, already warm) or in a new one, and wait
        until it has; CoreLoadFailed if it cannot."""
        core = core or CoreProcess.spawn(warm=False)
        try:
            core.send_load(request)
            loaded = await asyncio.to_thread(core.receive, Loaded)
        except BaseException:
            await asyncio.to_thread(core.kill)
            raise
        return cls(core.process, core.conn, loaded, on_death)

    # ---------------------------------------------------------- lifecycle (ModelHost)

    @property
    def stats(self) -> EngineStats:
        return self._stats

    @property
    def num_in_flight(self) -> int:
        return self._requests.num_in_flight

    @property
    def worker_pids(self) -> list[int]:
        return self._worker_pids

    @property
    def core_pid(self) -> Optional[int]:
        """The engine-core process."""
        return self._process.pid

    async def sleep(self) -> Freed:
        return await self.call(sleep_engine)

    async def wake(self) -> LoadTimings:
        return await self.call(wake_engine)

    async def install_lora(self, adapter: "LoraAdapter") -> None:
        """Hand the engine an adapter read here; its buffer crosses the pipe as one shared
        memory segment (runtime/lora/adapter.py). The engine's ValueError if it refuses."""
        await self.call(functools.partial(install_lora, adapter))

    async def remove_lora(self, name: str) -> None:
        """The engine's ValueError while a request it holds uses the adapter."""
        await self.call(functools.partial(remove_lora, name))

    async def stop(self) -> None:
        self._stopping = True
        self._stop_reading()
        self._conn.close()
        await asyncio.to_thread(self._process.join, STOP_TIMEOUT_S)
        if self._process.exitcode is None:
            self._process.kill()
            await asyncio.to_thread(self._process.join, STOP_TIMEOUT_S)
        self._loop.remove_reader(self._process.sentinel)

    # ---------------------------------------------------------- requests (the serving code)

    async def add(self, request_id: str, prompt_token_ids: list[int],
                  params: SamplingParams, priority: int = 0) -> RequestStream:
        """Queue a request; raises the core's ValueError (too long, bad ids) if it refuses."""
        return (await self.add_samples(request_id, prompt_token_ids, params, priority=priority))[0]

    async def add_samples(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                          lora: Optional[str] = None, priority: int = 0) -> list[RequestStream]:
        """One stream per sample, run with the adapter `lora` (None: the base) at
        `priority` (lower first); the core's ValueError if it refuses the request."""
        if self.error is not None:
            raise EngineDead(str(self.error))
        streams = self._requests.open(request_id, params.n)
        done: asyncio.Future[None] = self._loop.create_future()
        self._adds[streams[0].request_id] = (done, params.n)
        self._send(AddOp(streams[0].request_id, prompt_token_ids, params, lora, priority))
        await added(done, streams)
        return streams

    async def call(self, work: Callable[[Engine], T]) -> T:
        """Run `work` (a module-level function) on the engine between two steps (nothing
        else touches the engine meanwhile); its result, or its exception raised here."""
        if self.error is not None:
            raise EngineDead(str(self.error))
        call_id = next(self._call_ids)
        done: asyncio.Future[T] = self._loop.create_future()
        self._calls[call_id] = done
        self._send(CallOp(call_id, work))
        return await done

    # ---------------------------------------------------------- the pipe

    def _send(self, op: Op) -> None:
        self._outbox.append(op)
        if len(self._outbox) == 1:   # one message per loop turn, however many ops
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        ops, self._outbox = self._outbox, []
        if self.error is not None or self._stopping:
            return
        try:
            self._conn.send(ops)
        except OSError:
            pass   # the core is gone: its sentinel says so, and `_on_exit` fails everything

    def _on_readable(self) -> None:
        try:
            batch = self._conn.recv()
        except (EOFError, OSError):
            self._stop_reading()   # the core closed its end: `_on_exit` follows
            return
        self._handle(batch)
        if self._requests.num_undelivered > MAX_UNDELIVERED:
            self._loop.remove_reader(self._conn.fileno())
            self._loop.call_later(RESUME_CHECK_S, self._resume_when_drained)

    def _resume_when_drained(self) -> None:
        if self.error is not None or self._stopping:
            return
        if self._requests.num_undelivered > MAX_UNDELIVERED // 2:
            self._loop.call_later(RESUME_CHECK_S, self._resume_when_drained)
            return
        self._loop.add_reader(self._conn.fileno(), self._on_readable)

    def _handle(self, batch: StepBatch) -> None:
        for request_id, refusal in batch.added:
            self._added(request_id, refusal)
        for call_id, result, error in batch.calls:
            settle(self._calls.pop(call_id), result, error)
        self._requests.deliver(batch.outputs)
        if batch.error is not None:
            self.error = EngineDead(batch.error)
            self._requests.fail(batch.failed, self.error)
        self._stats = batch.stats

    def _added(self, request_id: str, refusal: Optional[str]) -> None:
        done, num_samples = self._adds.pop(request_id)
        if refusal is not None:   # the core never held it, nor its samples
            self._requests.forget(sample_ids(request_id, num_samples))
        settle(done, None, ValueError(refusal) if refusal is not None else None)

    def _on_exit(self) -> None:
        """The core process ended: deliver what it sent before, then fail the rest."""
        self._loop.remove_reader(self._process.sentinel)
        self._process.join(REAP_TIMEOUT_S)   # its sentinel closes a moment before it is reaped
        self._drain()
        self._stop_reading()
        if self._stopping:
            return
        reason = f"engine core process exited with code {self._process.exitcode}"
        self.error = EngineDead(reason)
        self._requests.fail_all(self.error)
        for future in [done for done, _ in self._adds.values()] + list(self._calls.values()):
            settle(future, None, self.error)
        self._adds.clear()
        self._calls.clear()
        self._on_death(reason)

    def _drain(self) -> None:
        try:
            while not self._conn.closed and self._conn.poll():
                self._handle(self._conn.recv())
        except (EOFError, OSError):
            pass

    def _stop_reading(self) -> None:
        if not self._conn.closed:
            self._loop.remove_reader(self._conn.fileno())


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


M = TypeVar("M")


@dataclass
class CoreProcess:
    """An engine-core process that has not loaded a model yet."""
    process: BaseProcess
    conn: Connection

    @classmethod
    def spawn(cls, warm: bool) -> "CoreProcess":
        """Start one (call from the loop's thread: PR_SET_PDEATHSIG follows the thread that
        started it); `warm`: it imports torch and builds the kernels at once (`warmed`)."""
        ctx = mp.get_context("spawn")            # fork would copy this process's threads
        ours, theirs = ctx.Pipe()
        process = ctx.Process(target=run_core, args=(theirs, warm), name="engine-core")
        process.start()
        theirs.close()
        return cls(process, ours)

    def send_load(self, request: "LoadRequest") -> None:
        try:
            self.conn.send(Load(request))
        except OSError:   # a standby's core that died while it waited
            self.process.join(STOP_TIMEOUT_S)
            raise CoreLoadFailed(self._exited()) from None

    async def warmed(self) -> float:
        """Wait for a warm core's warm-up; its seconds."""
        try:
            return (await asyncio.to_thread(self.receive, Warmed)).seconds
        except BaseException:
            await asyncio.to_thread(self.kill)
            raise

    def receive(self, kind: type[M]) -> M:
        """Block (in a worker thread) for the core's next message, of `kind`; CoreLoadFailed
        if it failed or exited instead."""
        while not self.conn.poll(0.2):
            if self.process.exitcode is not None:
                raise CoreLoadFailed(self._exited())
        try:
            message = self.conn.recv()
        except EOFError:
            self.process.join(STOP_TIMEOUT_S)
            raise CoreLoadFailed(self._exited()) from None
        if isinstance(message, LoadFailed):
            raise CoreLoadFailed(message.error)
        assert isinstance(message, kind), message
        return message

    def kill(self) -> None:
        self.conn.close()
        self.process.kill()
        self.process.join(STOP_TIMEOUT_S)

    def _exited(self) -> str:
        return f"engine core process exited with code {self.process.exitcode} while loading"
