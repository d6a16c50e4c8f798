"""What the replica's ModelHost asks of its engine beyond serving requests, whichever
way the engine runs: in a thread of the server process (`InThreadControl`, over
AsyncEngine) or in an engine-core process of its own (runtime/serve/engine_client.py).

`EngineInfo` is what the server needs to know of a loaded engine to serve it (its
context, its task, its load timings); the engine-core process sends it once loaded.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Protocol

from runtime.serve.async_engine import AsyncEngine
from runtime.load.timings import LoadTimings
from runtime.engine.outputs import EngineStats
from runtime.core.sleep_mode import Freed

if TYPE_CHECKING:   # importing the engine imports nothing heavy, but the caller decides when
    from runtime.engine.llm_engine import LLMEngine


@dataclass(frozen=True)
class EngineInfo:
    max_model_len: int                 # the context, capped by the KV cache
    task: str                          # "generate" | "embed"
    eos_token_ids: tuple[int, ...]     # the model config's, for the server's own tokenizer
    load_timings: dict[str, float]     # the /health load_timings (runtime/load/timings.py)

    @classmethod
    def of(cls, llm_engine: "LLMEngine", load_timings: dict[str, float]) -> "EngineInfo":
        return cls(llm_engine.max_model_len, llm_engine.config.task,
                   tuple(llm_engine.model_config.eos_token_ids), load_timings)


class EngineControl(Protocol):
    """The engine's lifecycle and health, as ModelHost sees it."""

    @property
    def error(self) -> Optional[BaseException]:
        """Set once the engine failed: in-flight requests got EngineDead."""

    @property
    def stats(self) -> EngineStats: ...

    @property
    def num_in_flight(self) -> int: ...

    @property
    def worker_pids(self) -> list[int]:
        """Tensor-parallel ranks 1..N-1 (empty on one rank)."""

    @property
    def core_pid(self) -> Optional[int]:
        """The engine-core process; None when the engine runs in the server process."""

    async def sleep(self) -> Freed: ...

    async def wake(self) -> LoadTimings: ...

    async def stop(self) -> None: ...


@dataclass
class InThreadControl:
    """EngineControl of an LLMEngine driven by an AsyncEngine thread in this process."""
    async_engine: AsyncEngine
    llm_engine: "LLMEngine"

    @property
    def error(self) -> Optional[BaseException]:
        return self.async_engine.error

    @property
    def stats(self) -> EngineStats:
        return self.async_engine.stats

    @property
    def num_in_flight(self) -> int:
        return self.async_engine.num_in_flight

    @property
    def worker_pids(self) -> list[int]:
        return self.llm_engine.worker_pids

    @property
    def core_pid(self) -> Optional[int]:
        return None

    async def sleep(self) -> Freed:
        return await self.async_engine.call(self.llm_engine.sleep)

    async def wake(self) -> LoadTimings:
        return await self.async_engine.call(self.llm_engine.wake)

    async def stop(self) -> None:
        await self.async_engine.stop()
        self.llm_engine.close()      # tensor-parallel workers, if any
