"""The lifecycle of the one model a replica serves: standby -> loading -> ready | failed,
and ready -> sleeping -> waking -> ready (runtime/core/sleep_mode.py).

A replica started with `--model` begins loading at once; one started with
`--standby` waits with torch already imported until `/admin/load` names a
model, so the pool can keep warm processes and skip the interpreter start.
The engine runs in an engine-core process of its own (runtime/serve/engine_core.py),
which loads the model while `/health` keeps answering here, and which a standby starts
(and warms) before any model is named; the server talks to it through an `EngineClient`
(runtime/serve/engine_client.py). A core that dies fails its requests, /health reports
failed, and the replica exits like one whose tensor-parallel worker died. Sleep and wake
run on the engine between steps; a replica is put to sleep only when no request is in
flight (`Refused` otherwise: the pool sends only idle replicas to sleep, so it never
drains), and from then on until it is ready again it refuses requests with 503. An
engine with adapter slots takes LoRA adapters by name while ready (runtime/serve/adapters.py),
those of `--lora-modules` before it says so.
"""
from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

from runtime.serve.adapters import AdapterRefused, ServedAdapters, import_reader
from runtime.serve.allocator import keep_large_blocks
from runtime.serve.embeddings import EmbeddingServing
from runtime.serve.engine_client import CoreProcess, EngineClient
from runtime.load.timings import LoadTimings, process_age_s
from runtime.lora.files import adapter_files
from runtime.serve.metrics import ServerMetrics
from runtime.serve.completions import OpenAIServing
from runtime.engine.outputs import EngineStats
from runtime.core.sleep_mode import Freed, NotIdle
from runtime.serve.parsed_tokenizers import ParsedTokenizers
from spec import engine_options
from wire.replica_control import Health, LoadRequest
from wire.replica_control import HealthStatus as Status     # the host's status is what /health says


if TYPE_CHECKING:   # importing the engine imports torch: only the engine-core process does
    from runtime.engine.llm_engine import LLMEngine

log = logging.getLogger("thawpool.runtime")
EXIT_WORKER_DIED = 3      # exit status of a replica whose tensor-parallel worker (or core) died
# A dead engine core's requests get their error event and /health says failed meanwhile.
EXIT_GRACE_S = 2.0


class WrongState(Exception):
    """Sleep or wake asked in a state that does not allow it (409)."""


@dataclass
class LoadedModel:
    """The model once its weights are in memory, and what serves it."""
    served_model_name: str
    engine: EngineClient          # its lifecycle too: stats, sleep, wake, stop
    serving: OpenAIServing
    embedding: Optional[EmbeddingServing] = None   # engine task "embed": /v1/embeddings
    adapters: Optional[ServedAdapters] = None      # None: the engine has no adapter slots


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
    import runtime.engine.llm_engine  # noqa: F401
    import runtime.engine.model_runner  # noqa: F401  (torch, the model code)
    return time.perf_counter() - start


def _default_device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def build_llm_engine(request: LoadRequest) -> tuple["LLMEngine", dict[str, float]]:
    """Construct the engine (in the engine-core process) with its load timings: see
    runtime/load/timings.py for the stages."""
    start = time.perf_counter()
    timings = LoadTimings()
    # a process that has not imported torch yet was started for this very load (a
    # standby imported it long before, off the critical path)
    timings.add("process", 0.0 if "torch" in sys.modules else process_age_s())
    timings.add("import", import_engine())      # the engine times the kernels itself
    from runtime.engine.llm_engine import LLMEngine
    llm_engine = LLMEngine(request.model, on_worker_failure=_end_replica, **request.engine_kwargs)
    for stage, seconds in llm_engine.load_timings.items():
        timings.add(stage, seconds)
    timings.weight_bytes = llm_engine.load_record.weight_bytes
    process_s = timings.stages["process"]
    return llm_engine, timings.summary(process_s + time.perf_counter() - start)


def replica_timings(core: dict[str, float], tokenizer_s: float, total_s: float) -> dict[str, float]:
    """The core's load stages, the server's tokenizer parse where it outlasted the core's
    whole load (the two run side by side), and the server's own total: its `other_s` is
    what no stage covers (the pipe, the server's event loop)."""
    out = {k: v for k, v in core.items() if k not in ("other_s", "total_s")}
    out["tokenizer_s"] = round(max(0.0, tokenizer_s - core.get("total_s", 0.0)), 6)
    staged = sum(v for k, v in out.items() if k.endswith("_s"))
    out["other_s"] = round(max(0.0, total_s - staged), 6)
    out["total_s"] = round(total_s, 6)
    return out


async def load_adapters(adapters: Optional[ServedAdapters], folders: Sequence[tuple[str, str]]) -> None:
    """Each (name, PEFT folder) loaded as a PUT would load it; AdapterRefused if one is not."""
    for name, folder in folders:
        if adapters is None:
            raise AdapterRefused(409, "max_loras: this engine has no adapter slots (max_loras is 0)")
        try:
            config_json, weights = await asyncio.to_thread(adapter_files, folder)
        except (OSError, ValueError) as exc:
            raise AdapterRefused(400, f"{name}: {exc}") from None
        await adapters.put(name, config_json, weights)
        await adapters.settle()


def _takes_adapters(request: LoadRequest) -> bool:
    """Whether the engine will have adapter slots (a bad option fails the load anyway)."""
    try:
        return engine_options.parse(request.engine_kwargs).max_loras > 0
    except ValueError:
        return False


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
        self._spare_core: Optional[CoreProcess] = None   # a standby's, warm, loading nothing yet
        self.status = Status.STANDBY
        self.error: Optional[str] = None
        self.load_timings: dict[str, float] = {}
        self.pending: Optional[LoadRequest] = None
        self.model: Optional[LoadedModel] = None
        self.metrics = ServerMetrics(self.stats)
        self._task: Optional[asyncio.Task[None]] = None
        self._reader: Optional[asyncio.Future[None]] = None   # the adapter reader's import
        self.tokenizers = ParsedTokenizers()   # a standby's, of the models it will likely load

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
        return self.model.engine.stats if self.model else None

    def start_loading(self, request: LoadRequest, lora_modules: Sequence[tuple[str, str]] = ()) -> None:
        """Begin loading in the background, with the adapters in `lora_modules` (name, PEFT
        folder) before it is ready; callers check `can_load` first."""
        self.status, self.error, self.pending = Status.LOADING, None, request
        self._task = asyncio.create_task(self._load(request, lora_modules))

    @property
    def can_load(self) -> bool:
        return self.status in (Status.STANDBY, Status.FAILED)

    async def _load(self, request: LoadRequest, lora_modules: Sequence[tuple[str, str]]) -> None:
        start = time.perf_counter()
        core, self._spare_core = self._spare_core, None
        # the server's tokenizer, parsed ahead where the pool named the model (prepare), else
        # here while the core loads the weights in its own process; where the parse
        # outlasts the load, that is the `tokenizer` stage
        parsing = asyncio.ensure_future(self.tokenizers.take(request.model))
        if _takes_adapters(request):
            keep_large_blocks()
            self._reader = asyncio.ensure_future(asyncio.to_thread(import_reader))
        try:
            client = await EngineClient.start(request, on_death=self._engine_died, core=core)
            tokenizer, parse_s = await parsing
        except Exception as exc:   # noqa: BLE001 - any failure is reported on /health
            parsing.cancel()
            self.status, self.error = Status.FAILED, f"{type(exc).__name__}: {exc}"
            self.load_timings = {"total_s": round(time.perf_counter() - start, 6)}
            return
        name, info = request.served_model_name, client.info
        adapters = ServedAdapters(client, info.adapters, name) if info.adapters is not None else None
        serving = OpenAIServing(name, client, tokenizer, info.max_model_len, self.metrics,
                                adapters if adapters is not None else frozenset())
        embedding = EmbeddingServing(name, client, tokenizer, self.metrics) \
            if info.task == "embed" else None
        self.model = LoadedModel(name, client, serving, embedding, adapters)
        try:
            await load_adapters(adapters, lora_modules)
        except AdapterRefused as exc:
            self.status, self.error = Status.FAILED, f"lora_modules: {exc.message}"
            return
        self.load_timings = replica_timings(info.load_timings, parse_s, time.perf_counter() - start)
        self.status = Status.READY

    def prepare(self, models: tuple[str, ...]) -> None:
        """A standby's: parse the tokenizers of the models it will likely load (LikelyModels),
        in the background; callers check `can_prepare` first."""
        self.tokenizers.prepare(models)

    @property
    def can_prepare(self) -> bool:
        return self.status is Status.STANDBY

    async def warm(self) -> float:
        """A standby's preparation (warm_imports), done where the engine will run: in a core
        process started now, which the load then uses."""
        core = CoreProcess.spawn(warm=True)
        seconds = await core.warmed()
        self._spare_core = core
        return seconds

    def _engine_died(self, reason: str) -> None:
        """The engine-core process is gone (killed, out of memory, a dead tensor-parallel
        worker): its requests have failed; /health says failed until the replica exits."""
        self.status, self.error = Status.FAILED, f"engine: {reason}"
        asyncio.get_running_loop().call_later(EXIT_GRACE_S, _end_replica, reason)

    async def sleep(self) -> tuple[Freed, float]:
        """Give the device back (what was freed, and the seconds it took); Refused unless
        ready with no request in flight."""
        model = self.ready_model
        if model is None or model.engine.num_in_flight:
            raise WrongState(f"replica is {self.status.value} with "
                          f"{model.engine.num_in_flight if model else 0} request(s) in flight")
        self.status = Status.SLEEPING          # refused from now on: no request can slip in
        start = time.perf_counter()
        try:
            freed = await model.engine.sleep()
        except NotIdle as exc:                 # one arrived before the status changed
            self.status = Status.READY
            raise WrongState(f"replica is busy: {exc}") from None
        except Exception as exc:
            self._broken("sleep", exc)
            raise
        return freed, time.perf_counter() - start

    async def wake(self) -> dict[str, float]:
        """Back to ready; the stages of the way back (runtime/core/sleep_mode.py)."""
        if self.status is not Status.SLEEPING or self.model is None:
            raise WrongState(f"replica is {self.status.value}, not sleeping")
        model, self.status = self.model, Status.WAKING
        start = time.perf_counter()
        try:
            timings = await model.engine.wake()
        except Exception as exc:
            self._broken("wake", exc)
            raise
        self.status = Status.READY
        return timings.summary(time.perf_counter() - start)

    def _broken(self, what: str, exc: Exception) -> None:
        """Half asleep or half awake, the model cannot be trusted: the replica has failed
        (/health says why, and the pool replaces it)."""
        self.status, self.error = Status.FAILED, f"{what} failed: {type(exc).__name__}: {exc}"

    def health(self) -> Health:
        status, error = self.status, self.error if self.status is Status.FAILED else None
        engine_error = self.model.engine.error if self.model else None
        if status is Status.READY and engine_error is not None:
            status, error = Status.FAILED, f"engine: {engine_error!r}"
        return Health(status, self.pending.served_model_name if self.pending else None,
                      self.load_timings, error,
                      tuple(self.model.engine.worker_pids) if self.model else (),
                      self.model.engine.core_pid if self.model else None)

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            # The load thread cannot be interrupted; let it finish so the process exits cleanly.
            await asyncio.gather(self._task, return_exceptions=True)
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        if self.model is not None:
            await self.model.engine.stop()
        if self._spare_core is not None:
            await asyncio.to_thread(self._spare_core.kill)
        self.tokenizers.close()
