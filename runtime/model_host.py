"""The lifecycle of the one model a replica serves: standby -> loading -> ready | failed,
and ready -> sleeping -> waking -> ready (runtime/sleep_mode.py).

A replica started with `--model` begins loading at once; one started with
`--standby` waits with torch already imported until `/admin/load` names a
model, so the pool can keep warm processes and skip the interpreter start.
Loading runs in a worker thread so `/health` keeps answering meanwhile. Sleep and
wake run on the engine's own thread between steps (AsyncEngine.call); a replica is
put to sleep only when no request is in flight (`Refused` otherwise: the pool sends
only idle replicas to sleep, so it never drains), and from then on until it is
ready again it refuses requests with 503.
"""
from __future__ import annotations

import asyncio
import enum
import logging
import os
import sys
import time
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Optional

from runtime.async_engine import AsyncEngine
from runtime.embedding_serving import EmbeddingServing
from runtime.load_timings import LoadTimings, process_age_s
from runtime.metrics import ServerMetrics
from runtime.openai_serving import OpenAIServing
from runtime.outputs import EngineStats
from runtime.sleep_mode import Freed, NotIdle

if TYPE_CHECKING:   # importing the engine imports torch: that happens in the load thread
    from runtime.engine import LLMEngine

log = logging.getLogger("thawpool.runtime")
EXIT_WORKER_DIED = 3      # exit status of a replica whose tensor-parallel worker died


class Status(str, enum.Enum):
    STANDBY = "standby"
    LOADING = "loading"
    READY = "ready"
    SLEEPING = "sleeping"
    WAKING = "waking"
    FAILED = "failed"


class Refused(Exception):
    """Sleep or wake asked in a state that does not allow it (409)."""


@dataclass(frozen=True)
class LoadRequest:
    model: str
    served_model_name: str
    engine_kwargs: dict[str, Any] = field(default_factory=dict)   # runtime.LLM kwargs


@dataclass
class LoadedModel:
    """The model once its weights are in memory, and what serves it."""
    served_model_name: str
    llm_engine: "LLMEngine"
    async_engine: AsyncEngine     # the one thread that drives llm_engine
    serving: OpenAIServing
    embedding: Optional[EmbeddingServing] = None   # engine task "embed": /v1/embeddings


def warm_imports(device: Optional[str] = None) -> float:
    """What a standby does before any load is asked for: import torch and the engine, and
    build or load the kernels for `device` (default: CUDA where there is one, else the
    CPU), so a later load pays only for the model itself."""
    start = time.perf_counter()
    import_engine()
    from runtime.models import import_all
    import_all()                                  # the model code too (0.17 s on SmolLM2's load)
    from kernels.dispatch import get_kernels
    get_kernels(device or _default_device())
    return time.perf_counter() - start


def import_engine() -> float:
    start = time.perf_counter()
    import runtime.engine  # noqa: F401
    import runtime.model_runner  # noqa: F401  (torch, the model code)
    return time.perf_counter() - start


def _default_device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def engine_kwarg_names() -> set[str]:
    from runtime.config import EngineConfig
    return {f.name for f in fields(EngineConfig)} - {"model", "extra"}


def build_llm_engine(request: LoadRequest) -> tuple["LLMEngine", dict[str, float]]:
    """Construct the engine (in a worker thread under the server) with its load timings:
    see runtime/load_timings.py for the stages."""
    start = time.perf_counter()
    timings = LoadTimings()
    # a process that has not imported torch yet was started for this very load (a
    # standby imported it long before, off the critical path)
    timings.add("process", 0.0 if "torch" in sys.modules else process_age_s())
    timings.add("import", import_engine())      # the engine times the kernels itself
    from runtime.engine import LLMEngine
    llm_engine = LLMEngine(request.model, on_worker_failure=_end_replica, **request.engine_kwargs)
    for stage, seconds in llm_engine.load_timings.items():
        timings.add(stage, seconds)
    timings.weight_bytes = llm_engine.load_record.weight_bytes
    process_s = timings.stages["process"]
    return llm_engine, timings.summary(process_s + time.perf_counter() - start)


def _end_replica(reason: str) -> None:
    """A tensor-parallel worker died (the watchdog already killed the others): the replica
    is beyond repair, so the process ends and the pool starts a whole new one."""
    log.critical("%s; the replica exits (status %d)", reason, EXIT_WORKER_DIED)
    sys.stderr.flush()
    os._exit(EXIT_WORKER_DIED)


class ModelHost:
    """The replica's one model through its lifecycle, and the metrics of everything it served
    (a replica that loads no model still answers /metrics)."""

    def __init__(self) -> None:
        self.status = Status.STANDBY
        self.error: Optional[str] = None
        self.load_timings: dict[str, float] = {}
        self.pending: Optional[LoadRequest] = None
        self.model: Optional[LoadedModel] = None
        self.metrics = ServerMetrics(self.stats)
        self._task: Optional[asyncio.Task[None]] = None

    @property
    def ready_model(self) -> Optional[LoadedModel]:
        """The model while it can serve: None until it is ready, and while it sleeps."""
        return self.model if self.status is Status.READY else None

    @property
    def serving(self) -> Optional[OpenAIServing]:
        """What answers completions; None unless the model is ready."""
        model = self.ready_model
        return model.serving if model is not None else None

    def stats(self) -> Optional[EngineStats]:
        return self.model.async_engine.stats if self.model else None

    def start_loading(self, request: LoadRequest) -> None:
        """Begin loading in the background; callers check `can_load` first."""
        self.status, self.error, self.pending = Status.LOADING, None, request
        self._task = asyncio.create_task(self._load(request))

    @property
    def can_load(self) -> bool:
        return self.status in (Status.STANDBY, Status.FAILED)

    async def _load(self, request: LoadRequest) -> None:
        start = time.perf_counter()
        try:
            llm_engine, timings = await asyncio.to_thread(build_llm_engine, request)
        except Exception as exc:   # noqa: BLE001 - any failure is reported on /health
            self.status, self.error = Status.FAILED, f"{type(exc).__name__}: {exc}"
            self.load_timings = {"total_s": round(time.perf_counter() - start, 6)}
            return
        async_engine = AsyncEngine(llm_engine)
        async_engine.start()
        serving = OpenAIServing(request.served_model_name, async_engine, llm_engine.tokenizer,
                                llm_engine.max_model_len, self.metrics)
        embedding = EmbeddingServing(request.served_model_name, async_engine, llm_engine.tokenizer,
                                     self.metrics) if llm_engine.config.task == "embed" else None
        self.model = LoadedModel(request.served_model_name, llm_engine, async_engine, serving,
                                 embedding)
        self.load_timings = timings
        self.status = Status.READY

    async def sleep(self) -> tuple[Freed, float]:
        """Give the device back (what was freed, and the seconds it took); Refused unless
        ready with no request in flight."""
        model = self.ready_model
        if model is None or model.async_engine.num_in_flight:
            raise Refused(f"replica is {self.status.value} with "
                          f"{model.async_engine.num_in_flight if model else 0} request(s) in flight")
        self.status = Status.SLEEPING          # refused from now on: no request can slip in
        start = time.perf_counter()
        try:
            freed = await model.async_engine.call(model.llm_engine.sleep)
        except NotIdle as exc:                 # one arrived before the status changed
            self.status = Status.READY
            raise Refused(f"replica is busy: {exc}") from None
        except Exception as exc:
            self._broken("sleep", exc)
            raise
        return freed, time.perf_counter() - start

    async def wake(self) -> dict[str, float]:
        """Back to ready; the stages of the way back (runtime/sleep_mode.py)."""
        if self.status is not Status.SLEEPING or self.model is None:
            raise Refused(f"replica is {self.status.value}, not sleeping")
        model, self.status = self.model, Status.WAKING
        start = time.perf_counter()
        try:
            timings = await model.async_engine.call(model.llm_engine.wake)
        except Exception as exc:
            self._broken("wake", exc)
            raise
        self.status = Status.READY
        return timings.summary(time.perf_counter() - start)

    def _broken(self, what: str, exc: Exception) -> None:
        """Half asleep or half awake, the model cannot be trusted: the replica has failed
        (/health says why, and the pool replaces it)."""
        self.status, self.error = Status.FAILED, f"{what} failed: {type(exc).__name__}: {exc}"

    def health(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) for /health."""
        body: dict[str, Any] = {"status": self.status.value}
        if self.pending is not None:
            body["model"] = self.pending.served_model_name
        if self.load_timings:
            body["load_timings"] = self.load_timings
        worker_pids = self.model.llm_engine.worker_pids if self.model else []
        if worker_pids:
            body["tensor_parallel"] = {"size": 1 + len(worker_pids), "worker_pids": worker_pids}
        engine_error = self.model.async_engine.error if self.model else None
        if self.status is Status.READY and engine_error is not None:
            body["status"], body["error"] = Status.FAILED.value, f"engine: {engine_error!r}"
            return 500, body
        if self.status is Status.FAILED:
            body["error"] = self.error
            return 500, body
        return (200 if self.status is Status.READY else 503), body

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            # The load thread cannot be interrupted; let it finish so the process exits cleanly.
            await asyncio.gather(self._task, return_exceptions=True)
        if self.model is not None:
            await self.model.async_engine.stop()
            self.model.llm_engine.close()      # tensor-parallel workers, if any
