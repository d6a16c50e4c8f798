"""Which deployment a call tries next, and how long it waits for a cold one: pure
functions of the called deployment's fallbacks (controlplane.deploy.fallback_spec) and
of what happened to the attempts so far. No clock, no pool, no I/O.

Attempts are numbered: 0 is the deployment the call named, k is `fallbacks[k - 1]`. After
attempt k failed with a condition, the call goes to the first later entry listing that
condition; one that cannot take the call (deleted since, or refusing the request) is
passed over with the same condition. A cold wait is the `cold_wait_s` of the entry a
`cold` condition would move the call to, and applies only where the attempt's
deployment has no ready replica: a warm one's queue waits as long as any call's.
"""
from __future__ import annotations

from typing import Optional, Sequence

from controlplane.deploy.fallback_spec import Condition, Fallback
from pool.api import (AdapterLoadFailed, ColdStartFailed, ColdStartTimeout, PoolError, QueueFull,
                      QuotaExceeded)

PRIMARY = 0


def next_attempt(fallbacks: Sequence[Fallback], attempt: int, condition: Condition) -> Optional[int]:
    """The attempt after `attempt` failed with `condition`: the first later entry that
    lists the condition; None when none does (the call answers with the failure)."""
    for k in range(attempt + 1, len(fallbacks) + 1):
        if condition in fallbacks[k - 1].on:
            return k
    return None


def replica_wait_s(fallbacks: Sequence[Fallback], attempt: int, ready: bool,
                   acquire_timeout_s: float) -> float:
    """How long attempt `attempt` waits for a replica: the cold wait of the entry a `cold`
    condition would go to when its deployment has no ready replica, else (or with no such
    entry) the gateway's acquire timeout."""
    cold_to = next_attempt(fallbacks, attempt, "cold")
    if ready or cold_to is None:
        return acquire_timeout_s
    return min(fallbacks[cold_to - 1].cold_wait_s, acquire_timeout_s)


def pool_condition(refusal: PoolError) -> Optional[Condition]:
    """The condition a pool's refusal of an acquire is: no replica in time (cold), the
    tenant's GPU quota or a full queue (rate_limited), a cold start that failed (error);
    None for a refusal of the request itself, which a fallback would refuse too."""
    if isinstance(refusal, ColdStartTimeout):
        return "cold"
    if isinstance(refusal, (QuotaExceeded, QueueFull)):
        return "rate_limited"
    if isinstance(refusal, (ColdStartFailed, AdapterLoadFailed)):
        return "error"
    return None


def answer_condition(http_status: int) -> Optional[Condition]:
    """A replica's answer status, as seen before any of it is relayed: 5xx is an error."""
    return "error" if http_status >= 500 else None
