"""A worker node that dies takes its replicas with it; replacements go to the survivor.

The node is removed with cluster.remove_node (its raylet and workers are
killed, like a lost machine); Ray then fails every actor that lived there.
The session fixture tops the cluster back up for any test that runs later.
"""
from __future__ import annotations

import os
import uuid
from functools import partial

import pytest

from pool.api import ColdStartFailed, RevisionSpec
from tests.pool_ray.conftest import GPUS_PER_NODE, gpus_free, start_on, wait_until
from spec.engine_options import ChosenOptions

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="session")]
CPU_ENGINE = ChosenOptions({"device": "cpu", "dtype": "float32", "kv_cache_tokens": 256})


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


async def test_lost_node_fails_its_replicas_and_replacements_land_on_the_survivor(backend, cluster, tiny_model):
    spec = RevisionSpec(f"rev-{uuid.uuid4().hex[:8]}", "dep-ray", "ten-ray", "s3://unused/tiny/",
                        gpu_memory_gb=0.25, engine=CPU_ENGINE)
    lost, survivor = cluster.workers[0], cluster.workers[1]
    slots = await backend.inventory()
    on_lost = [s for s in slots if s.node == lost.node_id]
    on_survivor = [s for s in slots if s.node == survivor.node_id]
    doomed = [await start_on(backend, spec, [s], tiny_model, f"doomed{i}") for i, s in enumerate(on_lost)]
    kept = await start_on(backend, spec, on_survivor[:1], tiny_model, "kept")

    cluster.remove_worker(lost)

    assert await wait_until(lambda: not any(h.is_alive() for h in doomed), 60)
    for handle in doomed:
        # whichever is seen first as the node goes: its actor's death or its process's kill
        reason = handle.exit_reason()
        assert "ray actor of the replica died" in reason or "exited with code -9" in reason, reason
        assert "node" in reason.lower(), reason
        assert await wait_until(partial(process_gone, handle.pid), 30), f"runtime {handle.pid} outlived its node"
    assert kept.is_alive()
    assert {s.node for s in await backend.inventory()} == {survivor.node_id}
    with pytest.raises(ColdStartFailed, match="left the cluster"):
        await start_on(backend, spec, on_lost[:1], tiny_model, "stale")

    free = [s for s in await backend.inventory() if s.slot_id != on_survivor[0].slot_id]
    replacement = await start_on(backend, spec, free[:1], tiny_model, "replacement")
    assert replacement.node_id == survivor.node_id and replacement.is_alive()
    assert gpus_free() == 0

    for handle in (*doomed, kept, replacement):
        await handle.stop(5)
    assert await wait_until(lambda: gpus_free() == GPUS_PER_NODE, 30), gpus_free()
