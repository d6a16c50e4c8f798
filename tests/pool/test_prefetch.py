"""Prefetch with the real pool and real SeaweedFS: a revision with `prefetch` has its
weights in the cache with no replica and no request, and its first cold start then
downloads nothing; a prefetch joins a pull already under way instead of repeating it;
one that fails is recorded, not fatal; it reads S3 as its own tenant.

Assertions are on bytes and GET counts, never on time; waits are bounded polls.
"""
from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

import pytest

from pool.api import Pins, RevisionSpec
from pool.weights.prefetch import Prefetched, PrefetchTarget, due
from pool.prefetcher import Prefetcher
from pool.registry import RevisionState
from pool.settings import PoolSettings
from pool.weights.cache import WeightCache
from pool.weights.store import CachedModel, WeightStore
from tests.pool.conftest import FlakyS3, make_settings, running_manager
from tests.support.model_factory import upload_model
from tests.support.waiting import eventually
from spec.engine_options import ChosenOptions

pytestmark = [pytest.mark.timeout(240), pytest.mark.asyncio(loop_scope="session")]


def spec_for(uri: str, **changes) -> RevisionSpec:
    base = dict(revision_id=f"rev-{uuid.uuid4().hex[:8]}", deployment_id="dep-p", tenant_id="ten-p",
                model_uri=uri, gpu_memory_gb=0.25, min_replicas=0, max_replicas=1,
                idle_timeout_s=600.0, engine=ChosenOptions({"kv_cache_tokens": 512}), prefetch=True)
    base.update(changes)
    return RevisionSpec(**base)


@pytest.fixture(scope="module")
async def pool(s3_server, tmp_path_factory):
    settings = make_settings(s3_server, tmp_path_factory.mktemp("prefetch-pool"), cpu_slots=1,
                             slot_memory_gb=1, warm_pool_size=0, tick_s=0.2, runtime_threads=1,
                             kv_cache_tokens_default=512, load_timeout_s=120, pull_timeout_s=60)
    async with running_manager(settings) as (manager, desired):
        yield manager, desired


async def test_a_prefetched_revision_is_cached_without_a_replica_and_its_cold_start_downloads_nothing(
        pool, s3_server, pool_bucket, fresh_prefix, tiny_model):
    manager, desired = pool
    spec = spec_for(upload_model(tiny_model, s3_server.client(), pool_bucket, f"{fresh_prefix}/tiny"))
    desired.put(spec)
    await manager.refresh()
    status = await eventually(lambda: _cached(manager, spec.revision_id), timeout_s=60,
                              what="the prefetched weights in the cache")
    assert status.replicas == () and status.state == "scaled_to_zero", "no replica was started for it"
    assert status.prefetch_error is None

    async with await manager.acquire(spec, request_id="p1", prefix_key=None, prompt_tokens=4,
                                     timeout_s=120) as lease:
        assert lease.cold_start is not None
        assert lease.cold_start.downloaded_bytes == 0, "every file came from the cache"
    desired.remove(spec.revision_id)
    await manager.refresh()


async def test_without_prefetch_nothing_is_pulled_before_a_request(pool, s3_server, pool_bucket,
                                                                  fresh_prefix, tiny_model):
    manager, desired = pool
    spec = spec_for(upload_model(tiny_model, s3_server.client(), pool_bucket, f"{fresh_prefix}/tiny"),
                    prefetch=False)
    desired.put(spec)
    await manager.refresh()
    await manager.tick()
    status = manager.revision_status(spec.revision_id)
    assert not status.weights_cached and status.state == "scaled_to_zero"
    desired.remove(spec.revision_id)
    await manager.refresh()


async def test_a_failed_prefetch_is_recorded_and_not_fatal(pool, pool_bucket, fresh_prefix):
    manager, desired = pool
    spec = spec_for(f"s3://{pool_bucket}/{fresh_prefix}/nothing-here/")
    desired.put(spec)
    await manager.refresh()
    status = await eventually(lambda: manager.revision_status(spec.revision_id).prefetch_error,
                              timeout_s=60, what="the prefetch's failure on the revision's status")
    assert "config.json" in status
    await manager.tick()                                   # the pool goes on
    assert not manager.revision_status(spec.revision_id).weights_cached
    desired.remove(spec.revision_id)
    await manager.refresh()


async def test_a_prefetch_and_a_cold_start_pull_download_each_file_once(s3, s3_server, pool_bucket,
                                                                       fresh_prefix, settings, tiny_model):
    uri = upload_model(tiny_model, s3_server.client(), pool_bucket, f"{fresh_prefix}/tiny")
    counting = FlakyS3(s3)
    store = WeightStore(counting, WeightCache(settings.cache_dir, settings.cache_budget_bytes), settings)
    prefetched, pulled = await asyncio.gather(store.cache_model(uri), store.fetch_model(uri))
    files = sum(1 for f in tiny_model.iterdir() if f.is_file())
    assert counting.calls == files, "one GET per file (each under the part size), not two"
    assert store.cache.holds(prefetched.keys) and set(prefetched.keys) == set(pulled.keys)
    store.release(pulled)


async def test_a_prefetch_reads_s3_as_the_revisions_own_tenant():
    stores = RecordingStores()
    prefetcher = Prefetcher(stores, PoolSettings(pull_timeout_s=30))
    spec = spec_for("s3://acme-own/m/", tenant_id="ten-acme",
                    engine=ChosenOptions({"speculative": {"method": "draft", "model": "s3://acme-own/draft/"}}))
    rev = RevisionState(spec, queue=None)  # type: ignore[arg-type] - the queue is not used here
    view = prefetcher.view(rev, reads_pool_cache=True, now=0.0)
    assert view.target == PrefetchTarget(("s3://acme-own/m/", "s3://acme-own/draft/"), 0) and view.wanted
    prefetcher.start(rev, view.target)
    assert prefetcher.view(rev, reads_pool_cache=True, now=0.0).running
    await eventually(lambda: rev.prefetched is not None and rev.prefetched.keys, timeout_s=10,
                     what="the prefetch finished")
    assert stores.asked == [("ten-acme", "s3://acme-own/m/"), ("ten-acme", "s3://acme-own/draft/")]
    assert not prefetcher.view(rev, reads_pool_cache=False, now=0.0).wanted, "a backend pulling on its nodes"


def test_a_learned_window_prefetches_once_per_idle_spell_ahead_of_it():
    """Idle spells of ten minutes: the window opens at 540 s of idleness; with a 60 s lead
    the weights are wanted from 480 s on, for that spell only, with no prefetch asked at
    deploy; a pool without learned windows wants nothing."""
    spec = spec_for("s3://acme-own/m/", prefetch=False)
    rev = RevisionState(spec, queue=None)  # type: ignore[arg-type] - the queue is not used here
    for _ in range(10):
        rev.idle_times.add(600.0)
    rev.last_activity = 1000.0
    learned = Prefetcher(RecordingStores(), PoolSettings(keep_alive="learned", prefetch_lead_s=60.0))
    assert not learned.view(rev, reads_pool_cache=True, now=1400.0).wanted
    view = learned.view(rev, reads_pool_cache=True, now=1490.0)
    assert view.wanted and view.target.spell == 1000.0 and due(view)
    rev.prefetched = Prefetched(view.target)
    assert not due(learned.view(rev, reads_pool_cache=True, now=1500.0)), "once a spell"
    rev.last_activity = 2000.0
    assert due(learned.view(rev, reads_pool_cache=True, now=2490.0)), "the next spell again"
    fixed = Prefetcher(RecordingStores(), PoolSettings())
    assert not fixed.view(rev, reads_pool_cache=True, now=2490.0).wanted


@dataclass
class RecordingStores:
    """SourceStores as the prefetcher uses it: which tenant asked for which URI."""
    asked: list[tuple[str, str]] = field(default_factory=list)

    async def store_for(self, tenant_id: str, uri: str) -> "RecordingStores":
        self.asked.append((tenant_id, uri))
        return self

    async def cache_model(self, uri: str, pins: Pins) -> CachedModel:
        return CachedModel((f"key-of-{uri}",), 1)


def _cached(manager, revision_id):
    status = manager.revision_status(revision_id)
    return status if status.weights_cached else None


def test_predicted_names_the_revisions_whose_call_is_near_for_the_standbys():
    """The same learned window tells the backend which models its standbys will likely
    load (pool/likely_models.py): from 480 s of idleness in a spell, until the window
    closes; never a retired revision."""
    spec = spec_for("s3://acme-own/m/", prefetch=False)
    rev = RevisionState(spec, queue=None)  # type: ignore[arg-type] - the queue is not used here
    for _ in range(10):
        rev.idle_times.add(600.0)
    rev.last_activity = 1000.0
    learned = Prefetcher(RecordingStores(), PoolSettings(keep_alive="learned", prefetch_lead_s=60.0))
    assert learned.predicted([rev], now=1400.0) == []
    assert learned.predicted([rev], now=1490.0) == [spec.revision_id]
    rev.prefetched = Prefetched(PrefetchTarget((spec.model_uri,), 0, 1000.0))
    assert learned.predicted([rev], now=1500.0) == [spec.revision_id], "prefetched or not"
    rev.retired = True
    assert learned.predicted([rev], now=1500.0) == []
