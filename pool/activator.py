"""The activator: a bounded queue of requests per revision while no replica is ready.

Waiters are dispatched by priority, then arrival, and a full queue sheds its worst
waiter for a newcomer of a better priority (pool/queue_order.py decides both); with one
priority for all it is a FIFO. A waiter is resolved with the id of the replica it was
dispatched to (the manager counts it in flight at that moment), or with the exception
that ends its wait. Nothing leaves the queue silently: it is dispatched, failed, times
out (ColdStartTimeout), was refused at the door or shed for a better one (QueueFull).
"""
from __future__ import annotations

import asyncio
import bisect
import itertools
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

from pool.api import ColdStartTimeout, QueueFull
from pool.queue_order import Rank, admit


@dataclass
class Waiter:
    request_id: str
    prompt_tokens: int
    prefix_key: Optional[str]
    enqueued_mono: float
    priority: int = 0                          # lower is served first (wire/priority.py)
    future: asyncio.Future[str] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    rank: Rank = Rank(0, 0)                    # set by the queue it joins

    @property
    def open(self) -> bool:
        return not self.future.done()


class RevisionQueue:
    def __init__(self, revision_id: str, limit: int):
        self.revision_id = revision_id
        self.limit = limit
        self._waiters: list[Waiter] = []       # by rank: the next to dispatch first
        self._arrivals = itertools.count()

    def __len__(self) -> int:
        return sum(1 for w in self._waiters if w.open)

    def __iter__(self) -> Iterator[Waiter]:
        return (w for w in self._waiters if w.open)

    @property
    def prompt_tokens(self) -> int:
        return sum(w.prompt_tokens for w in self)

    def oldest_mono(self) -> Optional[float]:
        return next((w.enqueued_mono for w in self), None)

    def push(self, waiter: Waiter, retry_after_s: float = 1.0) -> None:
        """Join in rank order; QueueFull when the queue is full of waiters at least as good,
        else the worst waiter gets QueueFull in its place."""
        self._drop_closed()
        waiter.rank = Rank(waiter.priority, next(self._arrivals))
        decision = admit([w.rank for w in self._waiters], waiter.rank, self.limit)
        if not decision.admitted:
            raise QueueFull(f"revision {self.revision_id}: {self.limit} requests already wait "
                            f"for a replica", retry_after_s=retry_after_s)
        if decision.shed is not None:
            self._shed(decision.shed, waiter.priority, retry_after_s)
        bisect.insort(self._waiters, waiter, key=_rank)

    def _shed(self, rank: Rank, newcomer: int, retry_after_s: float) -> None:
        shed = next(w for w in self._waiters if w.rank == rank)
        self._waiters.remove(shed)
        shed.future.set_exception(QueueFull(
            f"revision {self.revision_id}: shed from a full queue of {self.limit} for a request "
            f"of priority {newcomer} (this one's: {rank.priority}; lower runs first)",
            retry_after_s=retry_after_s))

    def remove(self, waiter: Waiter) -> None:
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass

    def dispatch(self, pick: Callable[[Waiter], Optional[str]]) -> int:
        """Hand waiters, best rank first, to the replica `pick` names; stop at the first None."""
        sent = 0
        while self._waiters:
            waiter = self._waiters[0]
            if not waiter.open:
                self._waiters.pop(0)
                continue
            replica_id = pick(waiter)
            if replica_id is None:
                break
            self._waiters.pop(0)
            waiter.future.set_result(replica_id)
            sent += 1
        return sent

    def fail_all(self, error: Exception) -> int:
        failed = 0
        while self._waiters:
            waiter = self._waiters.pop(0)
            if waiter.open:
                waiter.future.set_exception(error)
                failed += 1
        return failed

    def _drop_closed(self) -> None:
        self._waiters = [w for w in self._waiters if w.open]


async def wait_for_replica(queue: RevisionQueue, waiter: Waiter, timeout_s: float,
                           on_lost: Callable[[str], None], retry_after_s: float = 5.0) -> str:
    """The replica id the waiter got; ColdStartTimeout after timeout_s.

    If the wait ends (timeout, cancellation) just as a replica was assigned,
    `on_lost(replica_id)` gives the slot back so in-flight counts stay right.
    """
    try:
        return await asyncio.wait_for(asyncio.shield(waiter.future), timeout_s)
    except asyncio.TimeoutError:
        if _assigned(waiter):
            return waiter.future.result()
        waiter.future.cancel()
        queue.remove(waiter)
        raise ColdStartTimeout(f"revision {queue.revision_id}: no replica ready after "
                               f"{timeout_s:g}s (cold start still running)",
                               retry_after_s=retry_after_s) from None
    except asyncio.CancelledError:
        if _assigned(waiter):
            on_lost(waiter.future.result())
        else:
            waiter.future.cancel()
        queue.remove(waiter)
        raise


def _rank(waiter: Waiter) -> Rank:
    return waiter.rank


def _assigned(waiter: Waiter) -> bool:
    fut = waiter.future
    return fut.done() and not fut.cancelled() and fut.exception() is None
