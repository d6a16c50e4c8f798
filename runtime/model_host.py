"""The lifecycle of the one model a replica serves: standby -> loading -> ready | failed.

A replica started with `--model` begins loading at once; one started with
`--standby` waits with torch already imported until `/admin/load` names a
model, so the pool can keep warm processes and skip the interpreter start.
Loading runs in a worker thread so `/health` keeps answering meanwhile.
"""
from __future__ import annotations

import asyncio
import enum
import logging
import os
import sys
import time
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from runtime.async_engine import AsyncEngine
from runtime.outputs import EngineStats

log = logging.getLogger("thawpool.runtime")
EXIT_WORKER_DIED = 3      # exit status of a replica whose tensor-parallel worker died


class Status(str, enum.Enum):
    STANDBY = "standby"
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"


@dataclass(frozen=True)
class LoadRequest:
    model: str
    served_model_name: str
    engine: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoadedModel:
    """What the request handlers need once weights are in memory."""
    served_model_name: str
    engine: AsyncEngine
    tokenizer: Any               # runtime.tokenizer.Tokenizer
    vocab_size: int
    max_model_len: int
    worker_pids: list[int] = field(default_factory=list)   # tensor-parallel ranks 1..N-1


def warm_imports() -> float:
    """Import torch and the engine now, so a later load pays only for the weights."""
    start = time.perf_counter()
    import runtime.engine  # noqa: F401
    import runtime.model_runner  # noqa: F401  (torch, the model code and the kernels)
    return time.perf_counter() - start


def engine_kwarg_names() -> set[str]:
    from runtime.config import EngineConfig
    return {f.name for f in fields(EngineConfig)} - {"model", "extra"}


def _build_engine(request: LoadRequest) -> tuple[Any, dict[str, float]]:
    """Runs in a worker thread: construct the engine, timing each stage."""
    timings = {"import_s": round(warm_imports(), 6)}
    from runtime.engine import LLMEngine
    start = time.perf_counter()
    engine = LLMEngine(request.model, on_worker_failure=_end_replica, **request.engine)
    timings["engine_init_s"] = round(time.perf_counter() - start, 6)
    timings.update(_engine_stage_timings(engine))
    return engine, timings


def _end_replica(reason: str) -> None:
    """A tensor-parallel worker died (the watchdog already killed the others): the replica
    is beyond repair, so the process ends and the pool starts a whole new one."""
    log.critical("%s; the replica exits (status %d)", reason, EXIT_WORKER_DIED)
    sys.stderr.flush()
    os._exit(EXIT_WORKER_DIED)


def _engine_stage_timings(engine: Any) -> dict[str, float]:
    """The engine's own per-stage load times, whatever shape it reports them in."""
    timings = getattr(engine, "load_timings", None)
    stages = getattr(timings, "stages", timings)
    if not isinstance(stages, dict):
        return {}
    return {f"{k}_s" if not k.endswith("_s") else k: float(v) for k, v in stages.items()}


def _max_model_len(engine: Any) -> int:
    """The engine caps the context by its KV cache as well as by the model."""
    limit = getattr(engine, "max_model_len", None)
    return int(limit or engine.model_config.max_position_embeddings)


class ModelHost:
    def __init__(self) -> None:
        self.status = Status.STANDBY
        self.error: Optional[str] = None
        self.load_timings: dict[str, float] = {}
        self.pending: Optional[LoadRequest] = None
        self.model: Optional[LoadedModel] = None
        self._task: Optional[asyncio.Task] = None

    def stats(self) -> Optional[EngineStats]:
        return self.model.engine.stats if self.model else None

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
            engine, timings = await asyncio.to_thread(_build_engine, request)
        except Exception as exc:   # noqa: BLE001 - any failure is reported on /health
            self.status, self.error = Status.FAILED, f"{type(exc).__name__}: {exc}"
            self.load_timings = {"total_s": round(time.perf_counter() - start, 6)}
            return
        async_engine = AsyncEngine(engine)
        async_engine.start()
        self.model = LoadedModel(
            served_model_name=request.served_model_name, engine=async_engine,
            tokenizer=engine.tokenizer, vocab_size=engine.model_config.vocab_size,
            max_model_len=_max_model_len(engine), worker_pids=list(getattr(engine, "worker_pids", [])),
        )
        self.load_timings = {**timings, "total_s": round(time.perf_counter() - start, 6)}
        self.status = Status.READY

    def health(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) for /health."""
        body: dict[str, Any] = {"status": self.status.value}
        if self.pending is not None:
            body["model"] = self.pending.served_model_name
        if self.load_timings:
            body["load_timings"] = self.load_timings
        if self.model is not None and self.model.worker_pids:
            body["tensor_parallel"] = {"size": 1 + len(self.model.worker_pids),
                                       "worker_pids": self.model.worker_pids}
        engine_error = self.model.engine.error if self.model else None
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
            await self.model.engine.stop()
            self.model.engine.engine.close()      # tensor-parallel workers, if any
