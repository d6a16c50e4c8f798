"""Crash backoff: how long a revision waits before its next replica, a pure policy.

Each failure doubles the wait (base_s, 2 base_s, ... up to cap_s). A replica
that served and then crashed is replaced at once the first time (a one-off
crash should not cost a cold start's worth of waiting); one that served for
cap_s or longer starts the count afresh. After a failed cold start (the
replica never served) requests are refused at once with its reason for as
long as the wait lasts, instead of queueing for a start that is not coming.
Times are monotonic seconds passed in; nothing here reads a clock.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class BackoffConfig:
    base_s: float = 1.0
    cap_s: float = 60.0


@dataclass(frozen=True)
class Backoff:
    failures: int = 0
    start_after: float = 0.0        # no new replica before this
    refuse_until: float = 0.0       # after a failed cold start: answer 503 at once until this


@dataclass(frozen=True)
class Failure:
    now: float
    ready_at: Optional[float]       # when the failed replica became ready; None: it never served


def after_failure(state: Backoff, failure: Failure, config: BackoffConfig) -> tuple[Backoff, float]:
    """The state after one more failure, and the seconds to wait before the next start."""
    served = failure.ready_at is not None
    failures = state.failures
    if failure.ready_at is not None and failure.now - failure.ready_at >= config.cap_s:
        failures = 0
    failures += 1
    delay = delay_s(failures - (1 if served else 0), config)
    start_after = failure.now + delay
    return Backoff(failures, start_after, state.refuse_until if served else start_after), delay


def delay_s(counted: int, config: BackoffConfig) -> float:
    """0 for the first counted failure of a served replica (counted 0), then doubling."""
    if counted < 1:
        return 0.0
    return min(config.cap_s, config.base_s * 2.0 ** (counted - 1))


def may_start(state: Backoff, now: float) -> bool:
    return now >= state.start_after


def refusing_for_s(state: Backoff, now: float) -> Optional[float]:
    """Seconds left of refusing requests after a failed cold start, or None."""
    return state.refuse_until - now if now < state.refuse_until else None
