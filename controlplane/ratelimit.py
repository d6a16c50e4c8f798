"""Per-key token buckets for requests/min and tokens/min; the clock is passed in."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class TokenBucket:
    capacity: float            # the per-minute limit: a full minute's burst
    refill_per_s: float
    level: float
    updated_at: float

    @classmethod
    def per_minute(cls, limit: int, now: float) -> "TokenBucket":
        return cls(capacity=float(limit), refill_per_s=limit / 60.0, level=float(limit),
                   updated_at=now)

    def _refill(self, now: float) -> None:
        elapsed = max(0.0, now - self.updated_at)
        self.level = min(self.capacity, self.level + elapsed * self.refill_per_s)
        self.updated_at = now

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds until `amount` is available (0 when it is now)."""
        self._refill(now)
        amount = min(amount, self.capacity)      # a request larger than the bucket waits for a full one
        if self.level >= amount:
            return 0.0
        return (amount - self.level) / self.refill_per_s

    def take(self, amount: float, now: float) -> None:
        self._refill(now)
        self.level -= min(amount, self.capacity)


@dataclass(frozen=True)
class Limited:
    limit: str                 # "requests_per_min" | "tokens_per_min"
    retry_after_s: float


class RateLimiter:
    """Two buckets per key; admit() takes from both or from neither."""

    def __init__(self) -> None:
        self._buckets: dict[tuple[str, str], TokenBucket] = {}

    def _bucket(self, key_id: str, kind: str, limit: int, now: float) -> TokenBucket:
        bucket = self._buckets.get((key_id, kind))
        if bucket is None or bucket.capacity != limit:
            bucket = self._buckets[(key_id, kind)] = TokenBucket.per_minute(limit, now)
        return bucket

    def admit(self, key_id: str, *, requests_per_min: int, tokens_per_min: int,
              tokens: int, now: float) -> Optional[Limited]:
        requests = self._bucket(key_id, "requests_per_min", requests_per_min, now)
        token_bucket = self._bucket(key_id, "tokens_per_min", tokens_per_min, now)
        for name, bucket, amount in (("requests_per_min", requests, 1),
                                     ("tokens_per_min", token_bucket, tokens)):
            wait = bucket.wait_for(amount, now)
            if wait > 0:
                return Limited(name, wait)
        requests.take(1, now)
        token_bucket.take(tokens, now)
        return None
