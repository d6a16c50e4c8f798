"""The host-memory budget of sleeping replicas on one node: a pure decision.

A sleeping replica keeps its weights in host memory (pinned, on CUDA). On each node
they may take at most `sleep_host_memory_gb` together; a replica about to fall asleep
that would take its node past it makes room by stopping the sleepers there that fell
asleep first, and one that could not fit even alone stops instead of sleeping.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(frozen=True)
class Sleeper:
    replica_id: str
    node: str
    host_bytes: int
    since: float                     # monotonic: when it fell asleep


def make_room(sleepers: Sequence[Sleeper], node: str, host_bytes: int,
              budget_bytes: int) -> Optional[tuple[str, ...]]:
    """The sleepers on `node` to stop, oldest first, so that `host_bytes` more fit within
    budget_bytes; None when they would not fit even on a node with no sleeper."""
    if host_bytes > budget_bytes:
        return None
    here = sorted((s for s in sleepers if s.node == node), key=lambda s: (s.since, s.replica_id))
    taken = sum(s.host_bytes for s in here)
    stop: list[str] = []
    for oldest in here:
        if taken + host_bytes <= budget_bytes:
            break
        stop.append(oldest.replica_id)
        taken -= oldest.host_bytes
    return tuple(stop)
