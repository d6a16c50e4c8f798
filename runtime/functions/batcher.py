"""Dynamic batching as a pure decision over a clock the caller passes in.

Items wait in arrival order. A batch is due when `max_batch_size` items wait
(full) or the oldest has waited `max_wait_s` (its deadline): whichever comes
first. `take(now)` hands out the due batch (at most `max_batch_size`, oldest
first), `wait_s(now)` says how long until the next one is due, so the loop that
runs `predict` (runtime/functions/server.py) sleeps exactly that long or until
an item arrives. No clock is read here and nothing is awaited: the tests step
`now` by hand.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, Optional, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class BatchEntry(Generic[T]):
    item: T
    arrived: float


class Batcher(Generic[T]):
    def __init__(self, max_batch_size: int, max_wait_s: float):
        if max_batch_size < 1 or max_wait_s < 0:
            raise ValueError("max_batch_size >= 1 and max_wait_s >= 0")
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self._queue: deque[BatchEntry[T]] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, item: T, now: float) -> None:
        self._queue.append(BatchEntry(item, now))

    def is_due(self, now: float) -> bool:
        if not self._queue:
            return False
        return (len(self._queue) >= self.max_batch_size
                or now - self._queue[0].arrived >= self.max_wait_s)

    def take(self, now: float) -> list[T]:
        """The due batch, oldest first (empty when none is due)."""
        if not self.is_due(now):
            return []
        count = min(self.max_batch_size, len(self._queue))
        return [self._queue.popleft().item for _ in range(count)]

    def wait_s(self, now: float) -> Optional[float]:
        """Seconds until a batch is due without another arrival: 0 when one is due now,
        None when nothing waits."""
        if not self._queue:
            return None
        if self.is_due(now):
            return 0.0
        return self._queue[0].arrived + self.max_wait_s - now
