"""PoolManager end to end on Ray, built from settings alone (backend="ray"):
real S3, real runtime processes in Ray actors, no injected backend or client.

- A revision with min_replicas=3 gets three ready replicas that use both
  worker nodes, each node pulling the weights into its own cache; it serves a
  completion through a lease; with min_replicas back at 0 it scales to zero
  and every GPU of the cluster is free again.
- A second cold start of a revision goes to the node that already holds its
  weights, where plain best fit would pick the other node.
- Nodes that join or leave the cluster change the pool's slots.
"""
from __future__ import annotations

import dataclasses
import uuid
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest

from pool.api import RevisionSpec
from pool.backends.ray import RayBackend
from pool.in_memory import EventLog, InMemoryDesiredState
from pool.manager import PoolManager
from pool.s3 import open_client
from pool.weights.cache import WeightCache, entry_key
from pool.weights.store import WeightStore
from tests.pool.conftest import make_settings
from tests.pool_ray.conftest import GPUS_PER_NODE, gpus_free, wait_until
from tests.pool_ray.test_backend import CPU_ENGINE, complete
from tests.support.model_factory import upload_model
from spec.engine_options import ChosenOptions

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="session")]
LIVE = ("pending", "pulling", "loading", "ready", "draining")


def states(manager, revision_id: str) -> list[str]:
    return [r.state for r in manager.revision_status(revision_id).replicas]


def ready_nodes(manager, revision_id: str) -> list[str]:
    return [manager.handle(r.replica_id).node_id for r in manager.revision_status(revision_id).replicas
            if r.state == "ready"]


def pool_settings(cluster, s3_server, tmp_path: Path, **overrides):
    base = dict(backend="ray", ray_address=cluster.cluster.address, slot_memory_gb=1,
                warm_pool_size=0, tick_s=0.2, desired_refresh_s=0.5, scale_down_delay_s=0.5,
                runtime_threads=1, kv_cache_tokens_default=256, load_timeout_s=150, pull_timeout_s=60)
    base.update(overrides)
    return make_settings(s3_server, tmp_path, **base)


def spec_for(uri: str, **changes) -> RevisionSpec:
    base = dict(revision_id=f"rev-{uuid.uuid4().hex[:8]}", deployment_id="dep-ray", tenant_id="ten-ray",
                model_uri=uri, gpu_memory_gb=0.25, min_replicas=0, max_replicas=3, idle_timeout_s=1.0,
                engine=CPU_ENGINE)
    base.update(changes)
    return RevisionSpec(**base)


@asynccontextmanager
async def running_pool(settings, specs=()):
    desired = InMemoryDesiredState(list(specs))
    manager = PoolManager(settings, desired, EventLog())       # backend and S3 client from settings
    try:
        await manager.start()
        yield manager, desired
    finally:
        await manager.stop()


async def set_min_replicas(manager, desired, spec: RevisionSpec, count: int) -> RevisionSpec:
    changed = dataclasses.replace(spec, min_replicas=count)
    desired.put(changed)
    await manager.refresh()
    return changed


async def scaled_to_zero(manager, revision_id: str) -> bool:
    return await wait_until(lambda: not set(states(manager, revision_id)) & set(LIVE), 60)


async def model_keys(settings, uri: str, scratch: Path) -> set[str]:
    async with AsyncExitStack() as stack:
        client = await open_client(settings, stack)
        store = WeightStore(client, WeightCache(scratch, settings.cache_budget_bytes), settings)
        return {entry_key(o) for o in await store.list_model(uri)}


async def test_settings_alone_spread_three_replicas_then_scale_to_zero(cluster, s3_server, s3_bucket,
                                                                       tiny_model, tmp_path):
    settings = pool_settings(cluster, s3_server, tmp_path)
    uri = upload_model(tiny_model, s3_server.client(), s3_bucket, f"{uuid.uuid4().hex[:8]}/tiny")
    spec = spec_for(uri, min_replicas=3)
    async with running_pool(settings, [spec]) as (manager, desired):
        assert isinstance(manager.backend, RayBackend)
        assert manager.backend.address == cluster.cluster.address
        assert await wait_until(lambda: states(manager, spec.revision_id).count("ready") == 3, 240), \
            manager.revision_status(spec.revision_id)
        assert set(ready_nodes(manager, spec.revision_id)) == {n.node_id for n in cluster.workers}
        assert gpus_free() == 2 * GPUS_PER_NODE - 3
        assert not any((settings.cache_dir / "objects").iterdir()), "the pool's own cache pulled nothing"
        keys = await model_keys(settings, uri, tmp_path / "lister")
        assert await manager.backend.nodes_holding(keys) == {n.node_id for n in cluster.workers}
        handles = [manager.handle(r.replica_id) for r in manager.revision_status(spec.revision_id).replicas]

        async with await manager.acquire(spec, request_id="ray-1", prefix_key=None, prompt_tokens=1,
                                         timeout_s=30) as lease:
            assert (await complete(lease, lease.revision_id))["usage"]["completion_tokens"] == 4

        await set_min_replicas(manager, desired, spec, 0)
        assert await scaled_to_zero(manager, spec.revision_id), manager.revision_status(spec.revision_id)
        assert await wait_until(lambda: gpus_free() == 2 * GPUS_PER_NODE, 30), gpus_free()
        assert all(not h.is_alive() for h in handles)


async def test_second_cold_start_goes_to_the_node_holding_the_weights(cluster, s3_server, s3_bucket,
                                                                      tiny_model, tmp_path):
    """A two-GPU blocker takes the node best fit picks first (ties go to the lower node id),
    so the first cold start of `spec` lands on the other node and pulls there. With both
    nodes free again, best fit alone would pick the lower id; the cached node must win."""
    settings = pool_settings(cluster, s3_server, tmp_path)
    client, prefix = s3_server.client(), uuid.uuid4().hex[:8]
    blocker = spec_for(upload_model(tiny_model, client, s3_bucket, f"{prefix}/blocker"), gpu_count=2,
                       min_replicas=1, engine=ChosenOptions({**CPU_ENGINE, "tensor_parallel_size": 1}))
    spec = spec_for(upload_model(tiny_model, client, s3_bucket, f"{prefix}/tiny"))
    keys = await model_keys(settings, spec.model_uri, tmp_path / "lister")
    async with running_pool(settings, [blocker, spec]) as (manager, desired):
        assert await wait_until(lambda: "ready" in states(manager, blocker.revision_id), 240), \
            manager.revision_status(blocker.revision_id)
        spec = await set_min_replicas(manager, desired, spec, 1)
        assert await wait_until(lambda: "ready" in states(manager, spec.revision_id), 240), \
            manager.revision_status(spec.revision_id)
        [cached_node] = ready_nodes(manager, spec.revision_id)
        [blocked_node] = ready_nodes(manager, blocker.revision_id)
        assert cached_node != blocked_node
        assert cached_node != min(n.node_id for n in cluster.workers), "best fit alone would pick this node"

        blocker = await set_min_replicas(manager, desired, blocker, 0)
        spec = await set_min_replicas(manager, desired, spec, 0)
        assert await scaled_to_zero(manager, spec.revision_id), manager.revision_status(spec.revision_id)
        assert await scaled_to_zero(manager, blocker.revision_id), manager.revision_status(blocker.revision_id)
        assert await wait_until(lambda: gpus_free() == 2 * GPUS_PER_NODE, 30), gpus_free()
        assert await manager.backend.nodes_holding(keys) == {cached_node}

        spec = await set_min_replicas(manager, desired, spec, 1)
        assert await wait_until(lambda: "ready" in states(manager, spec.revision_id), 240), \
            manager.revision_status(spec.revision_id)
        assert ready_nodes(manager, spec.revision_id) == [cached_node]


async def test_nodes_joining_and_leaving_change_the_slots(cluster, s3_server, tmp_path):
    settings = pool_settings(cluster, s3_server, tmp_path)
    async with running_pool(settings) as (manager, _):
        before = {s.slot_id for s in manager.slots}
        assert len(before) == 2 * GPUS_PER_NODE
        joined = cluster.add_worker()
        cluster.cluster.wait_for_nodes()
        assert await wait_until(lambda: {s.node for s in manager.slots} >= {joined.node_id}, 60), manager.slots
        assert len(manager.slots) == 3 * GPUS_PER_NODE
        cluster.remove_worker(joined)
        assert await wait_until(lambda: {s.slot_id for s in manager.slots} == before, 60), manager.slots
