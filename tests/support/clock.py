"""A pool clock that a test can move forward, so timeouts do not race the machine's speed."""
from __future__ import annotations

import time

from pool.clock import Clock


class SteppedClock(Clock):
    """Real monotonic time plus an offset that only the test moves.

    Time passes as usual (load and drain timeouts still hold), and a test can jump past
    an idle timeout at the moment it chooses instead of configuring a short timeout and
    hoping that nothing between two requests takes longer. UTC stamps stay real.
    """

    def __init__(self) -> None:
        self.offset_s = 0.0

    def mono(self) -> float:
        return time.monotonic() + self.offset_s

    def advance(self, seconds: float) -> None:
        self.offset_s += seconds
