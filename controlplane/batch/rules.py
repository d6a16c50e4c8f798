"""The runner's decisions, clock-free over small snapshots: how many lines a deployment
may take now, what becomes of a line whose call was refused, and what a batch whose
lines have all ended becomes.

Batch work runs on capacity interactive traffic leaves idle: a deployment with ready
replicas takes lines while what it holds in flight (interactive and batch) is below
ready replicas × target concurrency, the load at which the autoscaler adds none; so
the runner never scales a deployment on its own, past its quota or otherwise. A
deployment with no ready replica takes one line at a time: its cold start is the
one any call would cause, within max_replicas and the tenant's quota (the pool's).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Optional, Union

RETRYABLE = frozenset({429, 502, 503, 504})
THROTTLED = 429            # the rate limit or a full queue: a wait, not a failed attempt


@dataclass(frozen=True)
class Capacity:
    """A deployment's replicas as the pool reports them, and the runner's own lines on it."""
    ready_replicas: int
    in_flight: int                 # every lease on its ready replicas (batch lines included)
    target_concurrency: int
    batch_in_flight: int           # the runner's lines on it, leased or still acquiring


def spare_slots(capacity: Capacity) -> int:
    """How many more lines the deployment may take now."""
    if capacity.ready_replicas == 0:
        return 0 if capacity.batch_in_flight else 1
    room = capacity.ready_replicas * capacity.target_concurrency
    return max(0, room - max(capacity.in_flight, capacity.batch_in_flight))


@dataclass(frozen=True)
class Retry:
    not_before: datetime
    counts_as_attempt: bool


@dataclass(frozen=True)
class Fail:
    code: str
    message: str


BUDGET_EXCEEDED = "budget_exceeded"      # a spend budget refused the line: it fails


def after_refusal(status: int, code: Optional[str], message: str, attempts: int,
                  max_attempts: int, now: datetime, backoff_s: float) -> Union[Retry, Fail]:
    """A line refused with `status`: retried later when the refusal is transient (a
    throttle never uses up an attempt), else failed with the refusal's code."""
    if status == THROTTLED and code != BUDGET_EXCEEDED:     # money spent does not come back
        return Retry(now + timedelta(seconds=backoff_s), counts_as_attempt=False)
    if status in RETRYABLE and attempts < max_attempts:
        return Retry(now + timedelta(seconds=backoff_s * 2 ** (attempts - 1)), counts_as_attempt=True)
    return Fail(code or f"http_{status}", message)


@dataclass(frozen=True)
class BatchState:
    status: str                    # in_progress | cancelling
    expires_at: datetime
    pending: int
    running: int


@dataclass(frozen=True)
class NextStep:
    """What the runner does to a batch now: end its pending lines (`end_pending_as`:
    expired or cancelled), and finalize it (write its files) into `final_status`."""
    end_pending_as: Optional[str] = None
    final_status: Optional[str] = None


def next_step(batch: BatchState, now: datetime) -> NextStep:
    ending = {"cancelling": "cancelled"}.get(batch.status)
    if ending is None and now >= batch.expires_at:
        ending = "expired"
    end_pending = ending if ending is not None and batch.pending else None
    pending = 0 if ending is not None else batch.pending
    if pending or batch.running:
        return NextStep(end_pending, None)
    return NextStep(end_pending, ending or "completed")
