"""Token-bucket pacing of a byte stream, as plain arithmetic over the times it is given.

A `TokenBucket` holds up to `burst_bytes` tokens and gains `rate_bytes_per_s` of them
per second. `reserve(nbytes, now)` takes nbytes at once, going into debt if it must,
and answers how long the caller waits before sending them: the debt paid back at the
rate. Reserving before each send (rather than refusing a send that does not fit) lets
a chunk larger than the burst through at exactly the rate, and keeps the pacing exact
over any run of chunk sizes: after the first burst, n bytes take n / rate seconds.

The bucket never reads a clock; the throttling proxy passes its loop's time in, and
the tests pass plain numbers.
"""
from __future__ import annotations


class TokenBucket:
    def __init__(self, rate_bytes_per_s: float, burst_bytes: int, now: float) -> None:
        if rate_bytes_per_s <= 0:
            raise ValueError(f"rate must be positive, not {rate_bytes_per_s}")
        if burst_bytes < 0:
            raise ValueError(f"burst must not be negative, not {burst_bytes}")
        self.rate = float(rate_bytes_per_s)
        self.burst = float(burst_bytes)
        self.tokens = float(burst_bytes)       # starts full: the first burst goes at once
        self.updated = now

    def reserve(self, nbytes: int, now: float) -> float:
        """Take nbytes; the seconds from `now` until they may be sent (0.0: at once)."""
        self._refill(now)
        self.tokens -= nbytes
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate

    def _refill(self, now: float) -> None:
        # a clock that steps back (it should not) refills nothing rather than draining
        elapsed = max(0.0, now - self.updated)
        self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
        self.updated = max(self.updated, now)
