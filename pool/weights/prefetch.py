"""Which revisions to prefetch now: a pure decision over small records.

A revision whose spec has `prefetch` gets its weights (its model's files, and a
draft model's) pulled into the pool's cache before a request needs them
(pool/prefetcher.py does the pulling):

  - when it appears in the desired state, or its weights change (another model
    or draft model URI);
  - on each scale-up decision of the autoscaler, since the cache may have
    evicted them meanwhile (pulling what is cached downloads nothing, and a pull
    a cold start already runs is joined, not repeated);
  - on predicted arrival, for any revision with a learned keep-alive window
    (pool/keep_alive.py): once per idle spell, `lead_s` before the window opens,
    so the replica started then loads from the cache instead of from S3
    (`predicted_due`).

One prefetch per revision at a time. A prefetch is tried once per target: one
that failed is tried again on the next change or scale-up, not on every tick.
Nothing here reads a clock or touches S3.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from pool.keep_alive import IdleWindow


@dataclass(frozen=True)
class PrefetchTarget:
    """What a prefetch of a revision pulls, and the scale-up it was for."""
    uris: tuple[str, ...]           # the model's URI, then a draft model's
    scale_ups: int                  # the revision's count of scale-up decisions
    spell: Optional[float] = None   # a predicted arrival's: when its idle spell began


@dataclass(frozen=True)
class PrefetchView:
    """What the decision sees of one revision."""
    revision_id: str
    wanted: bool                    # deployed with prefetch, on a backend that reads the pool's cache
    target: PrefetchTarget                  # what a prefetch would pull now
    last: Optional[PrefetchTarget] = None   # what its latest prefetch pulled, or tried to; None: never
    running: bool = False           # a prefetch of it is under way


def due(view: PrefetchView) -> bool:
    """Prefetch now: wanted, none running, and not yet tried for this target."""
    return view.wanted and not view.running and view.last != view.target


def predicted_due(window: Optional[IdleWindow], idle_for: Optional[float], lead_s: float) -> bool:
    """The learned window opens within lead_s (or is open): the call it predicts is near."""
    if window is None or idle_for is None:
        return False
    return window.prewarm_s - lead_s <= idle_for < window.until_s


def to_prefetch(views: Iterable[PrefetchView]) -> list[str]:
    """The revisions to start a prefetch for now, in the order given."""
    return [view.revision_id for view in views if due(view)]


@dataclass(frozen=True)
class Prefetched:
    """A revision's latest prefetch: what it pulled or tried to, the cache entries it
    filled, and why it failed (None: it did not, or has not finished)."""
    target: PrefetchTarget
    keys: tuple[str, ...] = ()
    error: Optional[str] = None
