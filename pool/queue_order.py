"""Who of a revision's waiting requests gets the next ready replica, and who is shed when
the queue is full: a pure decision over ranks, no clock, no futures.

A rank is (priority, arrival): lower goes first (wire/priority.py: interactive calls
before batch ones), and within one priority the earlier arrival. When the queue already
holds `limit` waiters, a newcomer of a strictly better priority takes the place of the
worst waiter (the worst priority, the latest of it), who is refused with 429 and
Retry-After; a newcomer that outranks nobody is refused itself. Among equal priorities
the queue stays FIFO and first come keeps its place, as it did before priorities.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(frozen=True, order=True)
class Rank:
    priority: int
    arrival: int                # the queue's arrival counter: lower came first


@dataclass(frozen=True)
class Admission:
    """A newcomer's fate at a queue: admitted (shedding `shed` to make room), or refused."""
    admitted: bool
    shed: Optional[Rank] = None


def admit(waiting: Sequence[Rank], newcomer: Rank, limit: int) -> Admission:
    """Whether `newcomer` joins a queue of `waiting` (any order) bounded by `limit`."""
    if len(waiting) < limit:
        return Admission(True)
    worst = max(waiting, default=None)
    if worst is not None and newcomer.priority < worst.priority:
        return Admission(True, shed=worst)
    return Admission(False)
