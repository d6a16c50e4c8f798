"""The lifecycle state machine of one replica, with a timestamp per transition.

pending -> pulling -> loading -> ready -> draining -> stopped, and failed
from any live state. A replica that is still starting may be stopped
directly (a cancelled cold start). Times are passed in: monotonic seconds
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
    STOPPED = "stopped"
    FAILED = "failed"


S = ReplicaState
ALLOWED: dict[ReplicaState, frozenset[ReplicaState]] = {
    S.PENDING: frozenset({S.PULLING, S.STOPPED, S.FAILED}),
    S.PULLING: frozenset({S.LOADING, S.STOPPED, S.FAILED}),
    S.LOADING: frozenset({S.READY, S.STOPPED, S.FAILED}),
    S.READY: frozenset({S.DRAINING, S.FAILED}),
    S.DRAINING: frozenset({S.STOPPED, S.FAILED}),
    S.STOPPED: frozenset(),
    S.FAILED: frozenset(),
}
STARTING = frozenset({S.PENDING, S.PULLING, S.LOADING})
LIVE = STARTING | {S.READY, S.DRAINING}


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

    def __post_init__(self) -> None:
        if not self.history:
            self.history.append(Transition(S.PENDING, self.created_mono, self.created_at))

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

    def seconds_in(self, state: ReplicaState) -> float:
        """Time spent in `state` (up to the following transition)."""
        for i, step in enumerate(self.history[:-1]):
            if step.state is state:
                return self.history[i + 1].mono - step.mono
        return 0.0
