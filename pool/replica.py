"""The lifecycle state machine of one replica, with a timestamp per transition.

pending -> pulling -> loading -> ready -> draining -> stopped, and failed
from any live state. A replica that is still starting may be stopped
directly (a cancelled cold start). The sleep tier: an idle replica drains into
sleeping (its process and host-memory weights kept, its slots given back) instead
of stopping; sleeping -> waking -> ready when a request comes, or sleeping ->
stopped after its sleep timeout, under host-memory pressure, or when the wake
cannot have its slots or fails (waking -> stopped). Times are passed in: monotonic seconds
for durations, UTC datetimes for events and billing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Optional


class ReplicaState(str, Enum):
    PENDING = "pending"
    PULLING = "pulling"
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    SLEEPING = "sleeping"
    WAKING = "waking"
    STOPPED = "stopped"
    FAILED = "failed"


ALLOWED: dict[ReplicaState, frozenset[ReplicaState]] = {
    ReplicaState.PENDING: frozenset({ReplicaState.PULLING, ReplicaState.STOPPED, ReplicaState.FAILED}),
    ReplicaState.PULLING: frozenset({ReplicaState.LOADING, ReplicaState.STOPPED, ReplicaState.FAILED}),
    ReplicaState.LOADING: frozenset({ReplicaState.READY, ReplicaState.STOPPED, ReplicaState.FAILED}),
    ReplicaState.READY: frozenset({ReplicaState.DRAINING, ReplicaState.FAILED}),
    ReplicaState.DRAINING: frozenset({ReplicaState.STOPPED, ReplicaState.SLEEPING, ReplicaState.FAILED}),
    ReplicaState.SLEEPING: frozenset({ReplicaState.WAKING, ReplicaState.STOPPED, ReplicaState.FAILED}),
    ReplicaState.WAKING: frozenset({ReplicaState.READY, ReplicaState.STOPPED, ReplicaState.FAILED}),
    ReplicaState.STOPPED: frozenset(),
    ReplicaState.FAILED: frozenset(),
}
STARTING = frozenset({ReplicaState.PENDING, ReplicaState.PULLING, ReplicaState.LOADING})
LIVE = STARTING | {ReplicaState.READY, ReplicaState.DRAINING, ReplicaState.SLEEPING, ReplicaState.WAKING}


class InvalidTransition(Exception):
    pass


@dataclass(frozen=True)
class Transition:
    state: ReplicaState
    mono: float
    at: datetime
    reason: Optional[str] = None


@dataclass
class Replica:
    replica_id: str
    revision_id: str
    created_mono: float
    created_at: datetime
    slot_ids: tuple[str, ...] = ()
    reason: Optional[str] = None
    history: list[Transition] = field(default_factory=list)
    env_s: float = 0.0                 # a function's venv stage, inside its time in PULLING
    downloaded_bytes: int = 0          # what its pull fetched from S3, not found in the cache
    load_stages: dict[str, float] = field(default_factory=dict)   # its /health load_timings once ready
    wake_stages: dict[str, float] = field(default_factory=dict)   # its /wake timings, of the latest wake

    def __post_init__(self) -> None:
        if not self.history:
            self.history.append(Transition(ReplicaState.PENDING, self.created_mono, self.created_at))

    @property
    def state(self) -> ReplicaState:
        return self.history[-1].state

    @property
    def since(self) -> datetime:
        return self.history[-1].at

    def can_move(self, to: ReplicaState) -> bool:
        return to in ALLOWED[self.state]

    def move(self, to: ReplicaState, mono: float, at: datetime, reason: Optional[str] = None) -> Transition:
        if not self.can_move(to):
            raise InvalidTransition(f"{self.replica_id}: {self.state.value} -> {to.value}")
        step = Transition(to, mono, at, reason)
        self.history.append(step)
        if reason:
            self.reason = reason
        return step

    def entered(self, state: ReplicaState) -> Optional[float]:
        """Monotonic time this replica entered `state`, or None."""
        return next((t.mono for t in self.history if t.state is state), None)

    def woken(self) -> Optional[tuple[Transition, Transition]]:
        """(waking, ready) when the replica's latest ready came from a wake, else None."""
        if len(self.history) >= 2 and self.history[-2].state is ReplicaState.WAKING \
                and self.history[-1].state is ReplicaState.READY:
            return self.history[-2], self.history[-1]
        return None

    def seconds_in(self, state: ReplicaState) -> float:
        """Time spent in `state` (up to the following transition)."""
        for i, step in enumerate(self.history[:-1]):
            if step.state is state:
                return self.history[i + 1].mono - step.mono
        return 0.0
