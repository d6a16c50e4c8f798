"""The engine-core process, the one way a replica runs its engine: it owns the LLMEngine
and runs the step loop (`CoreLoop`), so the steps never wait for the server's GIL (HTTP
parsing, SSE framing, detokenization all stay in the server process,
runtime/serve/engine_client.py).

One pipe joins the two. First the load: a core spawned for a `--standby` replica
imports torch and the engine and builds the kernels at once (`Warmed`), then waits;
either kind is sent one `Load` and answers `Loaded` or `LoadFailed`. Then each message
is a batch. In: a list of `Add`, `Abort` and `Call`, as many as the server's event
loop gathered in one turn. Out: one `StepBatch` per loop turn here (what the adds and
calls came to, the step's token deltas, the stats after it). The step loop:

  take every batch waiting (block only when no request is held) -> apply them ->
  step if any request is held -> send one StepBatch

A LoRA adapter the server has read comes in as a Call of `install_lora` (a dict insert
between two steps); its buffer is in shared memory, so the pipe carries a file
descriptor, not its megabytes, and the reader thread below unpickles it, off the loop.

A reader thread moves the server's batches into a queue as they come, so the server
never blocks on a step, and sees the pipe close: the server is gone (or stopping us),
and the process exits. It also dies with its parent (PR_SET_PDEATHSIG), so it never
outlives a server that was killed. `CoreLoop` needs nothing of the process but its end of
the pipe: tests run it in a thread over a pipe within one process, with the same messages.
"""
from __future__ import annotations

import ctypes
import os
import queue
import signal
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Union

from runtime.core.config import ModelConfig
from runtime.load.timings import LoadTimings
from runtime.engine.outputs import EngineStats, RequestOutput
from runtime.core.sleep_mode import Freed
from wire.sampling import SamplingParams

if TYPE_CHECKING:
    from runtime.engine.llm_engine import LLMEngine
    from runtime.lora.adapter import LoraAdapter
    from wire.replica_control import LoadRequest

PR_SET_PDEATHSIG = 1     # linux/prctl.h


class Engine(Protocol):
    """What the step loop drives: runtime.engine.llm_engine.LLMEngine (or a test's stand-in)."""
    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: SamplingParams, cache_salt: Optional[str] = None,
                    lora: Optional[str] = None, priority: int = 0) -> None: ...
    def abort_request(self, request_id: str) -> None: ...
    def step(self) -> list[RequestOutput]: ...
    def has_unfinished_requests(self) -> bool: ...
    def unfinished_request_ids(self) -> list[str]: ...
    def stats(self) -> EngineStats: ...
    def sleep(self) -> Freed: ...
    def wake(self) -> LoadTimings: ...
    def install_lora(self, adapter: "LoraAdapter") -> None: ...
    def remove_lora(self, name: str) -> None: ...


# ---------------------------------------------------------------- messages in

@dataclass
class Load:
    request: "LoadRequest"


@dataclass
class AddOp:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    lora: Optional[str] = None       # the adapter it runs with; None: the base
    priority: int = 0                # lower runs first (wire/priority.py)


@dataclass
class AbortOp:
    request_id: str


@dataclass
class CallOp:
    call_id: int
    work: Callable[[Engine], Any]   # a module-level function: pickled by name


Op = Union[AddOp, AbortOp, CallOp]


def sleep_engine(engine: Engine) -> Freed:
    return engine.sleep()


def wake_engine(engine: Engine) -> LoadTimings:
    return engine.wake()


def install_lora(adapter: "LoraAdapter", engine: Engine) -> None:
    """Read and checked in the server already (runtime/serve/adapters.py): a dict insert here."""
    engine.install_lora(adapter)


def remove_lora(name: str, engine: Engine) -> None:
    engine.remove_lora(name)


# ---------------------------------------------------------------- messages out

@dataclass(frozen=True)
class AdapterBase:
    """What the server reads and checks an adapter against, for an engine with adapter
    slots (runtime/serve/adapters.py)."""
    model_config: ModelConfig
    max_loras: int
    max_lora_rank: int


@dataclass(frozen=True)
class EngineInfo:
    """What the server needs to know of a loaded engine to serve it."""
    max_model_len: int                 # the context, capped by the KV cache
    task: str                          # "generate" | "embed"
    load_timings: dict[str, float]     # the /health load_timings (runtime/load/timings.py)
    adapters: Optional[AdapterBase] = None   # None: no adapter slots (max_loras 0)

    @classmethod
    def of(cls, llm_engine: "LLMEngine", load_timings: dict[str, float]) -> "EngineInfo":
        config = llm_engine.config
        adapters = AdapterBase(llm_engine.model_config, config.max_loras, config.max_lora_rank) \
            if config.max_loras else None
        return cls(llm_engine.max_model_len, config.task, load_timings, adapters)


@dataclass
class Warmed:
    seconds: float           # warm_imports, in the core


@dataclass
class Loaded:
    info: EngineInfo
    worker_pids: list[int]
    stats: EngineStats       # before any request: the KV cache's size


@dataclass
class LoadFailed:
    error: str               # "<exception type>: <message>", as /health shows it


@dataclass
class StepBatch:
    stats: EngineStats = field(default_factory=EngineStats)   # after the step
    added: list[tuple[str, Optional[str]]] = field(default_factory=list)   # id, refusal
    calls: list[tuple[int, Any, Optional[BaseException]]] = field(default_factory=list)
    outputs: list[RequestOutput] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)   # ids a failed step ended
    error: Optional[str] = None                       # why that step failed


# ---------------------------------------------------------------- the process

def run_core(conn: Connection, warm: bool) -> None:
    """The process main: warm up if asked, load what the server names, say so, then
    step until the server closes the pipe."""
    _die_with_parent()
    # ctrl-C, and the pool's SIGTERM to the replica's process group, reach this process
    # too: the server decides when it ends (it closes the pipe once its requests have
    # drained), and it dies with the server anyway
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from runtime.serve.model_host import build_llm_engine, warm_imports

    if warm:
        conn.send(Warmed(warm_imports()))
    try:
        load: Load = conn.recv()
    except EOFError:   # the server went before naming a model
        return
    try:
        engine, timings = build_llm_engine(load.request)
    except Exception as exc:   # noqa: BLE001 - the server reports it on /health
        conn.send(LoadFailed(f"{type(exc).__name__}: {exc}"))
        return
    try:
        conn.send(Loaded(EngineInfo.of(engine, timings), engine.worker_pids, engine.stats()))
        CoreLoop(engine, conn).run()
    finally:
        engine.close()


def _die_with_parent() -> None:
    """SIGKILL this process when the server process dies, however it dies."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:   # it died before the prctl took effect
        os._exit(1)


class CoreLoop:
    """The step loop, over the core's end of the pipe."""

    def __init__(self, engine: Engine, conn: Connection):
        self.engine, self.conn = engine, conn
        self.inbox: queue.SimpleQueue[Optional[list[Op]]] = queue.SimpleQueue()
        threading.Thread(target=self._read, name="engine-core-inbox", daemon=True).start()

    def _read(self) -> None:
        """The server's batches as they come; None once its end of the pipe is closed."""
        while True:
            try:
                batch = self.conn.recv()
            except (EOFError, OSError):
                self.inbox.put(None)
                return
            self.inbox.put(batch)

    def run(self) -> None:
        while (ops := self._take()) is not None:
            out = StepBatch()
            for op in ops:
                self._apply(op, out)
            if self.engine.has_unfinished_requests():   # an abort counts: it needs a step
                self._step(out)
            out.stats = self.engine.stats()
            try:
                self.conn.send(out)   # blocks while the pipe is full: the server's back-pressure
            except OSError:
                return

    def _take(self) -> Optional[list[Op]]:
        """Every batch waiting; waits for one only when the engine has nothing to do."""
        ops: list[Op] = []
        if not self.engine.has_unfinished_requests():
            first = self.inbox.get()
            if first is None:
                return None
            ops += first
        while True:
            try:
                more = self.inbox.get_nowait()
            except queue.Empty:
                return ops
            if more is None:
                return None
            ops += more

    def _apply(self, op: Op, out: StepBatch) -> None:
        if isinstance(op, AbortOp):
            self.engine.abort_request(op.request_id)   # ignored if it finished meanwhile
        elif isinstance(op, AddOp):
            out.added.append((op.request_id, self._add(op)))
        else:
            out.calls.append(self._call(op))

    def _add(self, op: AddOp) -> Optional[str]:
        try:
            self.engine.add_request(op.request_id, op.prompt_token_ids, op.params, lora=op.lora,
                                    priority=op.priority)
        except ValueError as exc:   # the refusal names the field: the client gets a 400
            return str(exc)
        return None

    def _call(self, op: CallOp) -> tuple[int, Any, Optional[BaseException]]:
        try:
            return op.call_id, op.work(self.engine), None
        except Exception as exc:  # noqa: BLE001 - handed to whoever awaits the call
            return op.call_id, None, exc

    def _step(self, out: StepBatch) -> None:
        try:
            out.outputs = self.engine.step()
        except Exception as exc:   # noqa: BLE001 - every in-flight request must hear of it
            out.failed = self.engine.unfinished_request_ids()
            for request_id in out.failed:
                self.engine.abort_request(request_id)
            out.error = f"engine step failed: {exc!r}"
