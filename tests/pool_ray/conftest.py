"""The Ray backend's tests: settings, a backend on the session's loopback cluster
(tests/support/ray_cluster.py) and waiting on Ray's resources."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="ray not installed")

from pool.settings import PoolSettings  # noqa: E402
from tests.support.ray_cluster import GPUS_PER_NODE, LoopbackCluster  # noqa: E402,F401


def ray_settings(tmp_path: Path, **overrides) -> PoolSettings:
    base = dict(accelerator="cpu", cache_dir=tmp_path / "pool-cache", slot_memory_gb=1.0,
                runtime_threads=1, kv_cache_tokens_default=256, load_timeout_s=120,
                pull_timeout_s=60, stop_timeout_s=5)
    base.update(overrides)
    return PoolSettings(**base)


@pytest.fixture
async def backend(cluster, tmp_path):
    from pool.backends.ray import RayBackend

    backend = RayBackend(ray_settings(tmp_path))
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()
        await wait_until(lambda: gpus_free() == GPUS_PER_NODE * len(cluster.workers), 30)


async def start_on(backend, spec, slots, folder: Path | None, replica_id: str):
    """backend.start_replica with the launch a cold start would make for it, `folder` given
    to the node as it is (None, or one it cannot read: the node pulls spec.model_uri)."""
    from pool.cold_start import launch_for

    launch = launch_for(spec, slots, backend.settings, backend, folder=folder)
    return await backend.start_replica(spec, launch, slots, replica_id)


def gpus_free() -> float:
    return ray.available_resources().get("GPU", 0.0)


async def wait_until(predicate, timeout_s: float, every_s: float = 0.2) -> bool:
    """Polls predicate until true or timeout; the caller asserts on the result."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(every_s)
    return bool(predicate())
