"""Which ready replica takes a request: a pure choice.

Least outstanding requests; with a prefix key, rendezvous hashing picks a
stable preferred order of replicas, and the first one in that order whose
load is within a bound of the least loaded wins (bounded-load affinity), so
affinity keeps prefix caches warm without piling onto one replica.

A request for a LoRA adapter goes by the same bound to a replica that holds the
adapter already (the least loaded of them), else by rendezvous on the adapter's
name, so each adapter settles on a few replicas instead of being loaded into all.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(frozen=True)
class Candidate:
    replica_id: str
    in_flight: int
    holds_adapter: bool = False     # holds the request's adapter (none asked: False)


@dataclass(frozen=True)
class RouterConfig:
    load_factor: float = 1.5     # affinity target may carry this times the least load...
    slack: int = 2               # ...or this many requests more, whichever is larger


def choose(candidates: Sequence[Candidate], prefix_key: Optional[str] = None,
           config: RouterConfig = RouterConfig(), adapter: Optional[str] = None) -> Optional[str]:
    if not candidates:
        return None
    least = min(c.in_flight for c in candidates)
    bound = least + max(config.slack, int(least * (config.load_factor - 1.0)))
    if adapter is not None:
        holders = [c for c in candidates if c.holds_adapter and c.in_flight <= bound]
        if holders:
            return _least_loaded(holders)
        prefix_key = adapter
    if prefix_key is None:
        return _least_loaded(candidates)
    for cand in rendezvous_order(candidates, prefix_key):
        if cand.in_flight <= bound:
            return cand.replica_id
    return _least_loaded(candidates)


def _least_loaded(candidates: Sequence[Candidate]) -> str:
    return min(candidates, key=lambda c: (c.in_flight, c.replica_id)).replica_id


def rendezvous_order(candidates: Sequence[Candidate], key: str) -> list[Candidate]:
    return sorted(candidates, key=lambda c: _score(c.replica_id, key), reverse=True)


def _score(replica_id: str, key: str) -> int:
    digest = hashlib.blake2b(f"{replica_id}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
