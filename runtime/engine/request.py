"""One request's state as the scheduler sees it (no torch)."""
from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

from runtime.engine.outputs import RequestMetrics
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
    lora: Optional[str] = None                            # the adapter it runs with; None: the base
    priority: int = 0                                     # lower runs first (wire/priority.py)
    token_ids: list[int] = field(default_factory=list)   # prompt + output, grows by one per step
    num_computed_tokens: int = 0                          # tokens whose k/v are in the cache
    num_cached_tokens: Optional[int] = None               # prefix-cache hit at first admission
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: Optional[str] = None
    num_preemptions: int = 0
    first_scheduled_time: Optional[float] = None
    first_token_time: Optional[float] = None
    finish_time: Optional[float] = None
    # n > 1: the other samples of this prompt, made (forked) once the prompt is computed
    samples: list["Request"] = field(default_factory=list)
    # its place in the scheduler's waiting or running list (runtime/engine/serve_order.py)
    order: tuple[int, int] = (0, 0)

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


@dataclass(frozen=True)
class History:
    """What the logits processors (runtime/engine/penalties.py) read of one sampled row: its
    request's tokens so far (the request's own list, read in place, never copied), where
    the output starts, and its EOS ids."""
    token_ids: Sequence[int]
    num_prompt_tokens: int
    eos_token_ids: tuple[int, ...] = ()

    @property
    def output_token_ids(self) -> Sequence[int]:
        return self.token_ids[self.num_prompt_tokens:]


def sample_requests(leader: Request) -> list[Request]:
    """The n - 1 requests that sample the leader's prompt alongside it: ids `<id>/<j>`, each
    with its own seed (derived from the leader's, so a seeded request repeats whole)."""
    ids = sample_ids(leader.request_id, leader.params.n)
    return [Request(request_id=ids[j], prompt_token_ids=leader.prompt_token_ids,
                    params=replace(leader.params, n=1, seed=sample_seed(leader.params.seed, j)),
                    arrival_time=leader.arrival_time, eos_token_ids=leader.eos_token_ids,
                    cache_salt=leader.cache_salt, lora=leader.lora, priority=leader.priority)
            for j in range(1, len(ids))]


def sample_ids(request_id: str, n: int) -> list[str]:
    """Every id the engine answers for a request of n samples, the leader's first."""
    return [request_id] + [f"{request_id}/{j}" for j in range(1, n)]


def sample_seed(seed: Optional[int], j: int) -> Optional[int]:
    """Sample j's seed: the request's own for j = 0, a hash of (seed, j) after it."""
    if seed is None or j == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}/{j}".encode(), digest_size=7).digest()
    return int.from_bytes(digest, "big")


def _or(value: Optional[float], default: float) -> float:
    return default if value is None else value
