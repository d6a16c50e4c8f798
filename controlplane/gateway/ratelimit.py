"""Rate limits as token buckets: requests and tokens per minute, per API key and per
tenant (over all its keys). The clock is passed in; nothing here reads one.

`admit` reserves a request's estimate (the prompt estimate plus its max_tokens) in
every bucket that applies, or in none, and says which limit refused it and for how
long. `settle` charges the real usage once the request has finished: what it did not
use goes back, what it used beyond the estimate is taken (a bucket may go below zero
then, and the next request waits for it to refill). A request the pool refused
settles with 0 tokens: it gets its reservation back.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Mapping, Optional, Union


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

    def take(self, amount: float, now: float) -> float:
        """Takes `amount` (at most a full bucket); returns what it took."""
        self._refill(now)
        taken = min(amount, self.capacity)
        self.level -= taken
        return taken

    def correct(self, taken: float, used: float, now: float) -> None:
        """`taken` was reserved, `used` was spent (charged up to a full bucket)."""
        self._refill(now)
        self.level = min(self.capacity, self.level + taken - min(used, self.capacity))


@dataclass(frozen=True)
class RateLimits:
    """One scope's limits (None: not limited)."""
    requests_per_min: Optional[int] = None
    tokens_per_min: Optional[int] = None


@dataclass(frozen=True)
class Limited:
    limit: str                 # "requests_per_min" | "tokens_per_min"
    scope: str                 # the scope that refused: "key" | "tenant"
    retry_after_s: float


@dataclass(frozen=True)
class RateReservation:
    """What `admit` reserved: (scope id, tokens taken) per token bucket."""
    reserved: tuple[tuple[str, float], ...] = ()


Scopes = Mapping[str, tuple[str, RateLimits]]      # scope id -> (scope kind, its limits)


@dataclass(frozen=True)
class _Charge:
    """What one bucket of one scope is asked for."""
    scope_id: str
    kind: str
    limit: str
    bucket: TokenBucket
    amount: float


class RateLimiter:
    """A requests bucket and a tokens bucket per scope id (e.g. "key:<id>", "tenant:<id>")."""

    def __init__(self) -> None:
        self._buckets: dict[tuple[str, str], TokenBucket] = {}

    def admit(self, scopes: Scopes, *, tokens: int, now: float) -> Union[RateReservation, Limited]:
        """Reserve one request and `tokens` in every scope's buckets, or in none."""
        charges = list(self._charges(scopes, tokens, now))
        for charge in charges:
            wait = charge.bucket.wait_for(charge.amount, now)
            if wait > 0:
                return Limited(charge.limit, charge.kind, wait)
        reserved = []
        for charge in charges:
            taken = charge.bucket.take(charge.amount, now)
            if charge.limit == "tokens_per_min":
                reserved.append((charge.scope_id, taken))
        return RateReservation(tuple(reserved))

    def settle(self, admission: RateReservation, used_tokens: int, now: float) -> None:
        """The request finished having used `used_tokens`: correct each token bucket."""
        for scope_id, taken in admission.reserved:
            bucket = self._buckets.get((scope_id, "tokens_per_min"))
            if bucket is not None:
                bucket.correct(taken, used_tokens, now)

    def _charges(self, scopes: Scopes, tokens: int, now: float) -> Iterator["_Charge"]:
        for scope_id, (kind, limits) in scopes.items():
            for limit, per_min, amount in (("requests_per_min", limits.requests_per_min, 1),
                                           ("tokens_per_min", limits.tokens_per_min, tokens)):
                if per_min is not None:
                    yield _Charge(scope_id, kind, limit, self._bucket(scope_id, limit, per_min, now),
                                  amount)

    def _bucket(self, scope_id: str, name: str, limit: int, now: float) -> TokenBucket:
        bucket = self._buckets.get((scope_id, name))
        if bucket is None or bucket.capacity != limit:
            bucket = self._buckets[(scope_id, name)] = TokenBucket.per_minute(limit, now)
        return bucket
