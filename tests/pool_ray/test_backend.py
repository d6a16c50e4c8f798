"""RayBackend on a two-node loopback Ray cluster with fake GPUs.

Replicas are real `runtime.serve.server` processes started by Ray actors; waits
are bounded polls, assertions are on what happened, never on elapsed time.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections import Counter

import httpx
import pytest

from pool.api import RevisionSpec
from tests.pool_ray.conftest import GPUS_PER_NODE, gpus_free, start_on, wait_until
from spec.engine_options import ChosenOptions

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="session")]
CPU_ENGINE = ChosenOptions({"device": "cpu", "dtype": "float32", "kv_cache_tokens": 256})


def spec_for(**changes) -> RevisionSpec:
    base = dict(revision_id=f"rev-{uuid.uuid4().hex[:8]}", deployment_id="dep-ray", tenant_id="ten-ray",
                model_uri="s3://unused/tiny/", gpu_memory_gb=0.25, engine=CPU_ENGINE)
    base.update(changes)
    return RevisionSpec(**base)


def free_slots_by_node(slots, count):
    """The first `count` slots, alternating nodes: what a spreading placement would pick."""
    by_node = {}
    for slot in slots:
        by_node.setdefault(slot.node, []).append(slot)
    order = [s for group in zip(*by_node.values()) for s in group]
    return order[:count]


async def wait_ready(handle, timeout_s: float = 180.0) -> bool:
    """Polls /health until 200; gives up early once the replica is dead."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=5) as client:
        while time.monotonic() < deadline and handle.is_alive():
            try:
                if (await client.get(f"{handle.base_url}/health")).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.3)
    return False


async def complete(handle, model: str) -> dict:
    """A completion from a replica (a handle or a lease), sent with its secret."""
    body = {"model": model, "prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0.0}
    async with httpx.AsyncClient(timeout=60, headers=handle.headers) as client:
        resp = await client.post(f"{handle.base_url}/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


async def refused_without_secret(handle, model: str) -> list[int]:
    """Statuses of a completion sent with no secret and with a wrong one."""
    body = {"model": model, "prompt": "The quick brown fox", "max_tokens": 4}
    async with httpx.AsyncClient(base_url=handle.base_url, timeout=60) as client:
        return [(await client.post("/v1/completions", json=body, headers=h)).status_code
                for h in ({}, {"Authorization": "Bearer not-the-secret"})]


async def test_inventory_has_one_cuda_slot_per_gpu_on_each_node(backend, cluster):
    slots = await backend.inventory()
    nodes = Counter(s.node for s in slots)
    assert dict(nodes) == {n.node_id: GPUS_PER_NODE for n in cluster.workers}
    assert {s.kind for s in slots} == {"cuda"}
    assert len({s.slot_id for s in slots}) == 2 * GPUS_PER_NODE
    assert sorted(s.device_index for s in slots) == [0, 0, 1, 1]


async def test_three_replicas_spread_serve_and_release_every_gpu(backend, cluster, tiny_model):
    spec = spec_for()
    slots = free_slots_by_node(await backend.inventory(), 3)
    handles = [await start_on(backend, spec, [slot], tiny_model, f"r{i}") for i, slot in enumerate(slots)]
    assert [h.node_id for h in handles] == [s.node for s in slots]
    assert {h.node_id for h in handles} == {n.node_id for n in cluster.workers}
    assert all(h.base_url.startswith("http://127.0.0.1:") for h in handles)
    assert gpus_free() == 1
    for handle in handles:
        assert await wait_ready(handle), handle.exit_reason()      # /health: open
        assert await refused_without_secret(handle, spec.revision_id) == [401, 401]
        out = await complete(handle, spec.revision_id)
        assert out["usage"]["completion_tokens"] == 4
    assert len({h.headers["Authorization"] for h in handles}) == 3   # a secret each
    for handle in handles:
        await handle.stop(5)
        backend.forget(handle)
    assert [h.is_alive() for h in handles] == [False] * 3
    assert await wait_until(lambda: gpus_free() == 2 * GPUS_PER_NODE, 30), gpus_free()


async def test_tensor_parallel_replica_gets_two_gpus_on_one_node(backend, tiny_model):
    """Two slots of one node make one replica of two ranks (tensor_parallel_size comes
    from the slot count), which holds both GPUs and serves the single-process answer."""
    from runtime import LLM, SamplingParams

    slots = await backend.inventory()
    node = slots[-1].node
    pair = [s for s in slots if s.node == node]
    spec = spec_for(gpu_count=2)                   # no tensor_parallel_size: the backend's
    handle = await start_on(backend, spec, pair, tiny_model, "tp")
    try:
        assert handle.node_id == node and len(handle.gpu_ids) == 2
        assert handle.group is not None
        assert gpus_free() == 2 * GPUS_PER_NODE - 2
        assert await wait_ready(handle), handle.exit_reason()
        async with httpx.AsyncClient(timeout=10, headers=handle.headers) as client:
            health = (await client.get(f"{handle.base_url}/health")).json()
        assert health["tensor_parallel"]["size"] == 2, health
        assert len(health["tensor_parallel"]["worker_pids"]) == 1
        served = await complete(handle, spec.revision_id)
    finally:
        await handle.stop(5)
    assert await wait_until(lambda: gpus_free() == 2 * GPUS_PER_NODE, 30), gpus_free()
    with LLM(str(tiny_model), kv_cache_tokens=256) as one_rank:
        (want,) = one_rank.generate(["The quick brown fox"],
                                    SamplingParams(max_tokens=4, temperature=0.0))
    assert served["choices"][0]["text"] == want.text
    assert served["usage"]["completion_tokens"] == len(want.token_ids)


async def test_runtime_exit_is_reported_with_its_code(backend, tiny_model):
    slots = await backend.inventory()
    handle = await start_on(backend, spec_for(), slots[:1], tiny_model, "killed")
    os.kill(handle.pid, signal.SIGKILL)          # same machine: the node's child is ours to see
    assert await wait_until(lambda: not handle.is_alive(), 60)
    assert "exited with code -9" in handle.exit_reason(), handle.exit_reason()
    await handle.stop(5)
    assert await wait_until(lambda: gpus_free() == 2 * GPUS_PER_NODE, 30), gpus_free()
