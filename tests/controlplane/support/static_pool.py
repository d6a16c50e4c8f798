"""A small real pool for gateway tests: leases a fixed list of runtime servers.

It implements the acquire()/Lease part of the PoolManager seam in
docs/interfaces.md and records every call, so tests can check what the
gateway asked for and that each lease was released exactly once.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Optional

from pool.api import ColdStartTimings, PoolError, RevisionSpec


@dataclass
class StaticLease:
    base_url: str
    replica_id: str
    queue_s: float = 0.0
    cold_start: Optional[ColdStartTimings] = None
    released: int = 0
    failed: bool = False

    def release(self) -> None:
        self.released += 1

    def mark_failed(self) -> None:
        self.failed = True

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.release()


@dataclass
class Acquired:
    spec: RevisionSpec
    request_id: str
    prefix_key: Optional[str]
    prompt_tokens: int
    timeout_s: float
    lease: StaticLease


@dataclass
class StaticPool:
    base_urls: list[str]
    refuse_with: Optional[PoolError] = None          # raise this from acquire() when set
    cold_start: Optional[ColdStartTimings] = None
    calls: list[Acquired] = field(default_factory=list)

    def __post_init__(self):
        self._next = itertools.cycle(range(len(self.base_urls)))

    async def acquire(self, spec: RevisionSpec, *, request_id: str, prefix_key: Optional[str],
                      prompt_tokens: int, timeout_s: float) -> StaticLease:
        if self.refuse_with is not None:
            raise self.refuse_with
        index = next(self._next)
        lease = StaticLease(self.base_urls[index], f"static-{index}",
                            queue_s=0.001, cold_start=self.cold_start)
        self.calls.append(Acquired(spec, request_id, prefix_key, prompt_tokens, timeout_s, lease))
        return lease
