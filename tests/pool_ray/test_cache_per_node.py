"""Weights are cached per node: a node that cannot read the pool's model folder
pulls the revision from S3 into its own cache (pool/weights/store.py's layout), and
the backend then reports that node, and only it, as holding the weights. A
speculative draft model named by URI is pulled there too."""
from __future__ import annotations

import uuid
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from pool.api import RevisionSpec
from pool.backends.ray import RayBackend
from pool.s3 import open_client
from pool.weights.cache import WeightCache, entry_key
from pool.weights.store import WeightStore
from tests.pool.conftest import make_settings
from tests.pool_ray.conftest import start_on
from tests.pool_ray.test_backend import CPU_ENGINE, complete, wait_ready
from tests.support.model_factory import upload_model

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="session")]


async def model_keys(settings, uri: str, scratch: Path) -> set[str]:
    """Cache keys of the model's objects, listed the way the pool lists them."""
    async with AsyncExitStack() as stack:
        client = await open_client(settings, stack)
        store = WeightStore(client, WeightCache(scratch, settings.cache_budget_bytes), settings)
        return {entry_key(o) for o in await store.list_model(uri)}


async def test_node_without_the_folder_pulls_into_its_own_cache(cluster, s3_server, s3_bucket, tiny_model, tmp_path):
    settings = make_settings(s3_server, tmp_path, runtime_threads=1, slot_memory_gb=1.0,
                             load_timeout_s=120, pull_timeout_s=60)
    prefix = uuid.uuid4().hex[:8]
    uri = upload_model(tiny_model, s3_server.client(), s3_bucket, f"{prefix}/tiny")
    draft_uri = upload_model(tiny_model, s3_server.client(), s3_bucket, f"{prefix}/draft")
    keys = await model_keys(settings, uri, tmp_path / "lister")
    draft_keys = await model_keys(settings, draft_uri, tmp_path / "lister")
    backend = RayBackend(settings)
    await backend.start()
    try:
        assert await backend.nodes_holding(keys) == set()
        target = (await backend.inventory())[0]
        engine = CPU_ENGINE.with_(speculative={"method": "draft", "model": draft_uri, "k": 2})
        spec = RevisionSpec(f"rev-{uuid.uuid4().hex[:8]}", "dep-ray", "ten-ray", uri, engine=engine)
        missing = Path("/nonexistent/thawpool/model")           # not readable on any node
        handle = await start_on(backend, spec, [target], missing, "pulled")

        assert await backend.nodes_holding(keys) == {target.node}
        assert keys | draft_keys <= set(await handle.cached(settings.cache_dir))
        assert (cluster.node_cache(target.node) / "objects").is_dir()
        assert not (settings.cache_dir / "objects").exists()    # nothing landed in the pool's own cache
        assert await wait_ready(handle), handle.exit_reason()
        assert (await complete(handle, spec.revision_id))["usage"]["completion_tokens"] == 4
    finally:
        await backend.close()
