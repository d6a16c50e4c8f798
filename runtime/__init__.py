"""thawpool runtime: one model replica. `import runtime` does not import torch."""
from typing import Any

from wire.sampling import SamplingParams

__all__ = ["LLM", "LLMEngine", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from runtime.llm import LLM
        return LLM
    if name == "LLMEngine":
        from runtime.engine.llm_engine import LLMEngine
        return LLMEngine
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")
