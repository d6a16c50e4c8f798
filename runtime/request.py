"""One request's state as the scheduler sees it (no torch)."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

from runtime.outputs import RequestMetrics
from wire.sampling import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    eos_token_ids: tuple[int, ...] = ()
    cache_salt: Optional[str] = None
    token_ids: list[int] = field(default_factory=list)   # prompt + output, grows by one per step
    num_computed_tokens: int = 0                          # tokens whose k/v are in the cache
    num_cached_tokens: Optional[int] = None               # prefix-cache hit at first admission
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: Optional[str] = None
    num_preemptions: int = 0
    first_scheduled_time: Optional[float] = None
    first_token_time: Optional[float] = None
    finish_time: Optional[float] = None

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids):]

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def metrics(self) -> RequestMetrics:
        end = self.finish_time if self.finish_time is not None else self.arrival_time
        scheduled = _or(self.first_scheduled_time, end)
        first_token = _or(self.first_token_time, end)
        return RequestMetrics(
            queue_s=scheduled - self.arrival_time,
            prefill_s=first_token - scheduled,
            ttft_s=first_token - self.arrival_time,
            decode_s=end - first_token,
            e2e_s=end - self.arrival_time,
        )


def _or(value: Optional[float], default: float) -> float:
    return default if value is None else value
