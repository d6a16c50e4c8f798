"""Prefetches run: a revision's weights pulled into the pool's cache in the background.

The manager asks which revisions are due (pool/weights/prefetch.py) after it reconciles them
and starts those here. A prefetch reads S3 exactly as a cold start does: through
SourceStores, with the credentials an admin granted the revision's own tenant for the
bucket (else the platform's), into the one cache; a download a cold start already runs
for the same object is joined (WeightStore.fetch_object), and nothing stays pinned
once it is done. It holds no GPU slot and blocks nothing: a failure is logged and kept
on the revision (its status's prefetch_error), never raised.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Iterable

from pool.api import ModelUnavailable, Pins, RevisionSpec
from pool.backends.runtime_args import draft_model_uri
from pool.cold_start import failure_reason
from pool.weights.prefetch import Prefetched, PrefetchView, PrefetchTarget, predicted_due, to_prefetch
from pool.registry import RevisionState, learned_window
from pool.settings import PoolSettings
from pool.weights.sources import SourceStores

log = logging.getLogger(__name__)


class Prefetcher:
    def __init__(self, stores: SourceStores, settings: PoolSettings):
        self.stores = stores
        self.settings = settings
        self.timeout_s = settings.pull_timeout_s
        self._running: dict[str, asyncio.Task[None]] = {}   # revision id -> its prefetch

    def view(self, rev: RevisionState, reads_pool_cache: bool, now: float) -> PrefetchView:
        """What pool.weights.prefetch.to_prefetch sees of the revision. A backend whose nodes pull
        for themselves has no pool cache to fill: nothing is wanted there. A call predicted
        by the revision's learned window (`now` is the monotonic clock) wants its weights
        once per idle spell, whether or not the deploy asked for prefetch."""
        spec = rev.spec
        predicted = self._predicted(rev, now)
        return PrefetchView(spec.revision_id, (spec.prefetch or predicted) and reads_pool_cache and not rev.retired,
                            PrefetchTarget(weight_uris(spec), rev.scale_ups,
                                           rev.last_activity if predicted else None),
                            rev.prefetched.target if rev.prefetched is not None else None,
                            spec.revision_id in self._running)

    def predicted(self, revisions: Iterable[RevisionState], now: float) -> list[str]:
        """The revisions a call is predicted for soon (their learned window opens within
        prefetch_lead_s), in the order given: their models are the likely next loads."""
        return [rev.spec.revision_id for rev in revisions if not rev.retired and self._predicted(rev, now)]

    def _predicted(self, rev: RevisionState, now: float) -> bool:
        idle_for = None if rev.last_activity is None else now - rev.last_activity
        return predicted_due(learned_window(rev, self.settings), idle_for, self.settings.prefetch_lead_s)

    def start_due(self, revisions: Iterable[RevisionState], reads_pool_cache: bool, now: float) -> None:
        """Start the prefetches pool.weights.prefetch.to_prefetch says are due."""
        views = {rev.spec.revision_id: (rev, self.view(rev, reads_pool_cache, now)) for rev in revisions}
        for revision_id in to_prefetch(view for _, view in views.values()):
            rev, view = views[revision_id]
            self.start(rev, view.target)

    def start(self, rev: RevisionState, target: PrefetchTarget) -> None:
        revision_id = rev.spec.revision_id
        rev.prefetched = Prefetched(target)          # tried: not again for this target
        task = asyncio.ensure_future(self._run(rev, target))
        self._running[revision_id] = task
        task.add_done_callback(lambda _done: self._running.pop(revision_id, None))

    async def close(self) -> None:
        """Cancel the prefetches under way (the pool is stopping)."""
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, rev: RevisionState, target: PrefetchTarget) -> None:
        revision_id = rev.spec.revision_id
        try:
            keys, downloaded = await asyncio.wait_for(
                self._pull(rev.spec.tenant_id, target.uris, rev.spec.pins), self.timeout_s)
        except asyncio.TimeoutError:
            self._failed(rev, target, f"timed out after {self.timeout_s:g}s")
            return
        except Exception as exc:  # noqa: BLE001 - never fatal: a cold start pulls for itself
            self._failed(rev, target, failure_reason(exc))
            return
        rev.prefetched = Prefetched(target, keys)
        log.info("prefetched %s (%s): %d bytes downloaded", revision_id, " ".join(target.uris), downloaded)

    async def _pull(self, tenant_id: str, uris: tuple[str, ...], pins: Pins) -> tuple[tuple[str, ...], int]:
        keys: tuple[str, ...] = ()
        downloaded = 0
        for uri in uris:
            store = await self.stores.store_for(tenant_id, uri)
            cached = await store.cache_model(uri, pins)
            keys += cached.keys
            downloaded += cached.downloaded_bytes
        return keys, downloaded

    def _failed(self, rev: RevisionState, target: PrefetchTarget, reason: str) -> None:
        log.warning("prefetch of %s failed: %s", rev.spec.revision_id, reason)
        rev.prefetched = Prefetched(target, error=reason)


def weight_uris(spec: RevisionSpec) -> tuple[str, ...]:
    """The model's URI, then its draft model's (a draft that is no URI fails its cold
    start, and is not prefetched)."""
    try:
        draft = draft_model_uri(spec.engine)
    except ModelUnavailable:
        draft = None
    return (spec.model_uri,) if draft is None else (spec.model_uri, draft)
