"""The order a replica serves its requests in: `fcfs`, or `priority` (vLLM's
`--scheduling-policy priority`): lower `priority` first, then arrival. No torch, no clock.

The scheduler (runtime/engine/scheduler.py) keeps its waiting and running lists in the
order this policy gives, and asks it whether a waiting request may take a running one's
place:

  waiting   a new request joins the back of its class; a preempted one goes back to the
            front of its class (it had started), as FCFS puts it in front of everyone.
  running   admitted requests are kept best first: the scheduler hands out the step's
            budget from the front and preempts from the back, so when blocks run out the
            request preempted is the worst (priority, admission) one.
  classes   waiting requests of a better class than some running ones are admitted before
            those run in a step, preempting the worst of them while the first finds no room
            (sequence slots or blocks). Never among equals, so FCFS holds within a class
            and two requests cannot thrash.

`fcfs` is the same rules with every request ranked alike: both policies order requests
of one priority exactly the same way.
"""
from __future__ import annotations

import bisect
import itertools
from typing import MutableSequence, Sequence

from runtime.engine.request import Request
from spec.engine_options import SCHEDULING_POLICIES


class ServeOrder:
    def __init__(self, policy: str = "fcfs"):
        if policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy: {policy!r} is not one of {', '.join(SCHEDULING_POLICIES)}")
        self.policy = policy
        self._ticks = itertools.count(1)

    def rank(self, request: Request) -> int:
        return request.priority if self.policy == "priority" else 0

    def arrive(self, waiting: MutableSequence[Request], request: Request) -> None:
        """A new request: behind every waiting request of its class."""
        self._place(waiting, request, next(self._ticks))

    def requeue(self, waiting: MutableSequence[Request], request: Request) -> None:
        """A preempted (or not yet placed) request: ahead of every waiting one of its class."""
        self._place(waiting, request, -next(self._ticks))

    def admit(self, running: MutableSequence[Request], request: Request) -> None:
        """Into the running list, behind the running requests of its class."""
        self._place(running, request, next(self._ticks))

    def ahead_of(self, running: Sequence[Request], candidate: Request) -> int:
        """How many of `running` (best first) rank at or above `candidate`: those after them
        are of a strictly worse class, which `candidate` goes before."""
        return bisect.bisect_right(running, self.rank(candidate), key=self.rank)

    def _place(self, queue: MutableSequence[Request], request: Request, tick: int) -> None:
        request.order = (self.rank(request), tick)
        bisect.insort(queue, request, key=_order)


def _order(request: Request) -> tuple[int, int]:
    return request.order
