"""What comes out of the engine: per-step deltas, final outputs, metrics, stats."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from wire.responses import TokenLogprobs   # (chosen logprob, [(token_id, logprob)] top-N)


@dataclass
class RequestMetrics:
    """Seconds, measured by the engine with a monotonic clock."""
    queue_s: float = 0.0      # arrival -> first scheduled
    prefill_s: float = 0.0    # first scheduled -> prompt fully computed
    ttft_s: float = 0.0       # arrival -> first output token
    decode_s: float = 0.0     # first token -> finished
    e2e_s: float = 0.0        # arrival -> finished

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 6) for k, v in self.__dict__.items()}


@dataclass
class RequestOutput:
    """What one engine step produced for one request (a delta)."""
    request_id: str
    new_token_ids: list[int]
    new_logprobs: Optional[list[TokenLogprobs]] = None
    finished: bool = False
    finish_reason: Optional[str] = None   # "stop" | "length" | "abort"
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    metrics: Optional[RequestMetrics] = None   # set when finished
    embedding: Optional[list[float]] = None    # task "embed": the pooled, normalized prompt


@dataclass
class CompletionOutput:
    """What LLM.generate returns per prompt."""
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    num_cached_tokens: int = 0
    finish_reason: Optional[str] = None
    logprobs: Optional[list[TokenLogprobs]] = None
    metrics: Optional[RequestMetrics] = None
    embedding: Optional[list[float]] = None      # LLM.embed


@dataclass
class EngineStats:
    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    prefix_cache_queries: int = 0     # prompt tokens looked up
    prefix_cache_hits: int = 0        # prompt tokens found cached
    num_preemptions: int = 0
    weight_bytes: int = 0             # the loaded weights on the device (int8 ones included)
    spec_proposed: int = 0
    spec_accepted: int = 0

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0
