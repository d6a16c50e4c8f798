"""When a failed delivery is tried again, and when it is given up: a pure schedule.

The n-th retry waits `base_s * 2**(n-1)`, capped at `cap_s`, of which the upper half is
jittered (so receivers that failed together are not hit together again, and no retry
comes sooner than half its step). A delivery is given up after `max_attempts` attempts,
or when the next one would fall past `max_age_s` after the event.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Optional


@dataclass(frozen=True)
class RetryPolicy:
    base_s: float = 5.0
    cap_s: float = 3600.0
    max_attempts: int = 12
    max_age_s: float = 3 * 86_400.0


def delay_s(policy: RetryPolicy, attempts_made: int, jitter: float) -> float:
    """The wait after the `attempts_made`-th failed attempt; `jitter` in [0, 1)."""
    step = min(policy.cap_s, policy.base_s * 2.0 ** (attempts_made - 1))
    return step / 2 + step / 2 * jitter


def retry_at(policy: RetryPolicy, attempts_made: int, created_at: datetime, now: datetime,
             jitter: float) -> Optional[datetime]:
    """When to try again after a failed attempt at `now`; None: give the delivery up."""
    if attempts_made >= policy.max_attempts:
        return None
    at = now + timedelta(seconds=delay_s(policy, attempts_made, jitter))
    if at > created_at + timedelta(seconds=policy.max_age_s):
        return None
    return at
