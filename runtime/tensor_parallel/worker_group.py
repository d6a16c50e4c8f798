"""The processes of a tensor-parallel replica: rank 0 is the engine, ranks 1..N-1 are
workers it spawns (as nano-vllm does), each running a ModelRunner over its shard.

Rank 0 sends every model call to the workers over a pipe (method name and its plain
arguments: scheduled chunks, token ids), runs the same call itself, then collects one
reply per worker. Only rank 0 samples; the workers' logits are dropped. The model
calls meet in torch.distributed collectives, so every rank must make the same calls
in the same order, which the pipe guarantees.

Failure is all or nothing. A worker that raises reports its traceback and exits; a
watchdog thread on rank 0 notices any worker that exits, kills the rest and calls
`on_failure` (the server exits there, so the pool replaces the whole replica; offline
use gets the reason raised at the next call). A worker exits by itself when rank 0
goes away: its pipe closes, or its parent process changes.
"""
from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import os
import threading
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Optional

from runtime.core.config import EngineConfig, ModelConfig
from runtime.tensor_parallel.shards import TensorParallel

log = logging.getLogger("thawpool.runtime.workers")

# Model calls whose result rank 0 wants back from the workers; the rest reply None.
REPLIES = frozenset({"weight_memory", "sleep"})


class WorkerDied(RuntimeError):
    """A tensor-parallel worker exited or failed; the replica cannot go on."""


class WorkerGroup:
    def __init__(self, model_config: ModelConfig, config: EngineConfig, host: str = "127.0.0.1"):
        size = config.tensor_parallel_size
        self.init_method = f"tcp://{host}:{_rendezvous_port(host)}"
        self.failure: Optional[str] = None
        self.on_failure: Optional[Callable[[str], None]] = None
        self._closing = False
        ctx = mp.get_context("spawn")            # fork would copy rank 0's threads and torch state
        self._conns: list[Connection] = []
        self._procs: list[mp.Process] = []
        for rank in range(1, size):
            ours, theirs = ctx.Pipe()
            tp = TensorParallel(rank, size, self.init_method)
            proc = ctx.Process(target=worker_main, args=(tp, model_config, config, theirs, os.getpid()),
                               name=f"tp-worker-{rank}", daemon=True)
            proc.start()
            theirs.close()
            self._conns.append(ours)
            self._procs.append(proc)
        self._watchdog = threading.Thread(target=self._watch, name="tp-watchdog", daemon=True)
        self._watchdog.start()

    def rank0(self) -> TensorParallel:
        return TensorParallel(0, len(self._procs) + 1, self.init_method)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def send(self, method: str, *args: Any) -> None:
        """Start `method(*args)` on every worker (rank 0 then runs it itself)."""
        self._check()
        try:
            for conn in self._conns:
                conn.send((method, args))
        except (BrokenPipeError, EOFError, OSError) as exc:
            raise self._died(f"tensor-parallel worker unreachable: {exc!r}") from exc

    def collect(self) -> list[Any]:
        """Each worker's reply to the last `send`, in rank order."""
        replies = []
        for rank, conn in enumerate(self._conns, start=1):
            try:
                status, value = conn.recv()
            except (EOFError, OSError) as exc:
                raise self._died(f"tensor-parallel worker rank {rank} went away: {exc!r}") from exc
            if status != "ok":
                raise self._died(f"tensor-parallel worker rank {rank} failed:\n{value}")
            replies.append(value)
        return replies

    def explain(self, exc: BaseException) -> BaseException:
        """A collective that failed on rank 0 because a worker died: say which and why."""
        self._watchdog.join(timeout=2.0)       # give the watchdog the moment to read the exit
        return WorkerDied(self.failure) if self.failure else exc

    def close(self) -> None:
        self._closing = True
        for conn in self._conns:
            conn.close()                       # a worker waiting for work exits on EOF
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)

    def _check(self) -> None:
        if self.failure is not None:
            raise WorkerDied(self.failure)

    def _died(self, reason: str) -> WorkerDied:
        self._fail(reason)
        return WorkerDied(self.failure or reason)

    def _watch(self) -> None:
        """Block until any worker exits; unless we are closing, that ends the replica."""
        sentinels = {p.sentinel: (rank, p) for rank, p in enumerate(self._procs, start=1)}
        ready = wait(list(sentinels))
        if self._closing:
            return
        rank, proc = sentinels[ready[0]]
        proc.join(timeout=1)
        self._fail(f"tensor-parallel worker rank {rank} (pid {proc.pid}) exited with code {proc.exitcode}")

    def _fail(self, reason: str) -> None:
        if self.failure is not None:
            return
        self.failure = reason
        log.error("%s; stopping the replica's other workers", reason)
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
        if self.on_failure is not None:
            self.on_failure(reason)


def worker_main(tp: TensorParallel, model_config: ModelConfig, config: EngineConfig,
                conn: Connection, parent_pid: int) -> None:
    """Rank tp.rank: load the shard, then run what rank 0 sends until its pipe closes."""
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    from runtime.load.timings import LoadTimings
    from runtime.engine.model_runner import ModelRunner

    try:
        # the draft model of speculation, if any, runs whole on rank 0
        config = dataclasses.replace(config, speculative=None)
        runner = ModelRunner(model_config, config, LoadTimings(), tp=tp)
        while True:
            try:
                method, args = conn.recv()
            except EOFError:
                break
            result = getattr(runner, method)(*args)
            conn.send(("ok", result if method in REPLIES else None))
    except Exception:  # noqa: BLE001 - rank 0 must hear why before this worker exits
        try:
            conn.send(("error", traceback.format_exc()))
        finally:
            os._exit(1)
    finally:
        tp.disconnect()


def _rendezvous_port(host: str) -> int:
    """A free port for torch.distributed's store (runtime/ does not import pool/)."""
    import socket

    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _exit_with_parent(parent_pid: int) -> None:
    """Rank 0 may die while this worker is busy (not waiting on the pipe): exit too."""
    import time

    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(1)
