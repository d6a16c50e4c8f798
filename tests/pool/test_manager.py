"""PoolManager end to end on this machine: real SeaweedFS S3, real runtime.server processes.

Two CPU slots, a warm pool of one standby process. Idle timeouts are long and are
passed by stepping the pool's clock, so no test depends on how fast this machine
serves two requests. Waits are event-driven with generous bounds; nothing asserts on
elapsed time.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

import httpx
import pytest

from pool.api import ColdStartFailed, ColdStartTimeout, NeverFits, ReplicaShape, RevisionSpec
from pool.desired import EventLog, InMemoryDesiredState
from pool.manager import PoolManager
from tests.pool.conftest import FlakyS3, make_settings
from tests.support.clock import SteppedClock
from tests.support.model_factory import upload_model

pytestmark = [pytest.mark.timeout(240), pytest.mark.asyncio(loop_scope="session")]
PROMPT = "The quick brown fox"
IDLE_TIMEOUT_S = 600.0        # passed by SteppedClock.advance, never by waiting


def spec_for(uri: str, **changes) -> RevisionSpec:
    base = dict(revision_id=f"rev-{uuid.uuid4().hex[:8]}", deployment_id="dep-1", tenant_id="ten-1",
                model_uri=uri, gpu_memory_gb=0.25, gpu_count=1, min_replicas=0, max_replicas=1,
                target_concurrency=4, idle_timeout_s=IDLE_TIMEOUT_S,
                engine={"kv_cache_tokens": 512})
    base.update(changes)
    return RevisionSpec(**base)


@pytest.fixture(scope="module")
async def pool(s3_server, pool_bucket, tiny_model, tmp_path_factory):
    from contextlib import AsyncExitStack
    from pool.s3 import open_client

    tmp = tmp_path_factory.mktemp("pool")
    settings = make_settings(s3_server, tmp, cpu_slots=2, slot_memory_gb=1, warm_pool_size=1,
                             tick_s=0.2, scale_down_delay_s=0.5, runtime_threads=1,
                             kv_cache_tokens_default=512, crash_backoff_base_s=0.2,
                             load_timeout_s=120, pull_timeout_s=60)
    uri = upload_model(tiny_model, s3_server.client(), pool_bucket, f"{uuid.uuid4().hex[:8]}/tiny")
    desired, events = InMemoryDesiredState(), EventLog()
    async with AsyncExitStack() as stack:
        s3 = FlakyS3(await open_client(settings, stack))
        manager = PoolManager(settings, desired, events, s3_client=s3, clock=SteppedClock())
        try:
            await manager.start()
            yield manager, desired, events, uri, s3
        finally:
            await manager.stop()
            for proc in list(getattr(manager.backend, "_all", {}).values()):
                proc.kill_now()           # only if stop() itself failed


async def complete(lease, **extra) -> dict:
    body = {"model": lease.revision_id, "prompt": PROMPT, "max_tokens": 8, "temperature": 0.0, **extra}
    async with httpx.AsyncClient(timeout=60) as client:
        resp = await client.post(f"{lease.base_url}/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


async def wait_no_live_replicas(manager, revision_id, timeout_s=30.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        status = manager.revision_status(revision_id)
        if not any(r.state in ("pending", "pulling", "loading", "ready", "draining") for r in status.replicas):
            return True
        await asyncio.sleep(0.1)
    return False


async def test_cold_warm_scale_to_zero_and_back(pool):
    manager, desired, events, uri, s3 = pool
    spec = spec_for(uri)
    desired.put(spec)

    started = time.monotonic()
    async with await manager.acquire(spec, request_id="r1", prefix_key=None, prompt_tokens=4, timeout_s=120) as lease:
        waited_s = time.monotonic() - started
        assert lease.cold_start is not None
        assert lease.cold_start.download_s > 0 and lease.cold_start.load_s > 0
        # the stages fit in the thaw, and the thaw in the time this acquire took
        assert lease.cold_start.download_s + lease.cold_start.load_s <= lease.cold_start.total_s
        assert lease.cold_start.total_s <= waited_s
        first = await complete(lease)
    text = first["choices"][0]["text"]
    assert first["usage"]["completion_tokens"] == 8 and text
    replica_1 = lease.replica_id
    assert await events.wait_for(lambda _: "ready" in events.states(replica_1), 10)
    assert events.states(replica_1) == ["pending", "pulling", "loading", "ready"]
    ev = [e for e in events.events if e.replica_id == replica_1][-1]
    assert (ev.revision_id, ev.deployment_id, ev.tenant_id, len(ev.slot_ids)) == (spec.revision_id, "dep-1", "ten-1", 1)

    async with await manager.acquire(spec, request_id="r2", prefix_key="p", prompt_tokens=4, timeout_s=30) as warm:
        assert warm.cold_start is None and warm.replica_id == replica_1
        assert (await complete(warm))["choices"][0]["text"] == text
    assert manager.revision_status(spec.revision_id).state == "ready"

    manager.clock.advance(IDLE_TIMEOUT_S - 5)                  # not idle long enough yet
    await manager.tick()
    assert manager.revision_status(spec.revision_id).state == "ready"
    assert events.states(replica_1)[-1] == "ready", "kept before the idle timeout"
    manager.clock.advance(10)                                  # now past it
    assert await wait_no_live_replicas(manager, spec.revision_id)
    assert await events.wait_for(lambda _: "stopped" in events.states(replica_1), 10)
    assert events.states(replica_1) == ["pending", "pulling", "loading", "ready", "draining", "stopped"]
    assert manager.revision_status(spec.revision_id).state == "scaled_to_zero"

    gets_before = s3.calls
    async with await manager.acquire(spec, request_id="r3", prefix_key=None, prompt_tokens=4, timeout_s=120) as again:
        assert again.cold_start is not None and again.replica_id != replica_1
        assert s3.calls == gets_before           # weight cache hit: no GET at all
        assert (await complete(again))["choices"][0]["text"] == text


async def test_killed_replica_gives_clean_error_then_a_fresh_replica(pool):
    manager, desired, events, uri, _ = pool
    spec = spec_for(uri, idle_timeout_s=30)
    desired.put(spec)
    lease = await manager.acquire(spec, request_id="k1", prefix_key=None, prompt_tokens=4, timeout_s=120)
    pid = manager.handle(lease.replica_id).process.pid
    body = {"model": lease.revision_id, "prompt": PROMPT, "max_tokens": 400, "temperature": 0.0,
            "ignore_eos": True, "stream": True}
    got_first = False
    with pytest.raises(httpx.HTTPError):
        async with httpx.AsyncClient(timeout=30) as client:
            async with client.stream("POST", f"{lease.base_url}/v1/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data:") and not got_first:
                        got_first = True
                        os.kill(pid, signal.SIGKILL)
    assert got_first
    lease.mark_failed()
    lease.release()
    ok = await events.wait_for(lambda evs: any(e.replica_id == lease.replica_id and e.state == "failed"
                                               for e in evs), 10)
    assert ok
    failed = next(r for r in manager.revision_status(spec.revision_id).replicas if r.replica_id == lease.replica_id)
    assert "exited with code -9" in failed.reason

    async with await manager.acquire(spec, request_id="k2", prefix_key=None, prompt_tokens=4, timeout_s=120) as fresh:
        assert fresh.replica_id != lease.replica_id and fresh.cold_start is not None
        assert (await complete(fresh))["usage"]["completion_tokens"] == 8
    desired.remove(spec.revision_id)
    await manager.refresh()
    assert await wait_no_live_replicas(manager, spec.revision_id)


async def test_missing_weights_fail_the_cold_start_with_reason(pool, s3_server, pool_bucket, tiny_model):
    manager, desired, _, _, _ = pool
    prefix = f"{uuid.uuid4().hex[:8]}/broken"
    s3_server.client().upload_file(str(tiny_model / "config.json"), pool_bucket, f"{prefix}/config.json")
    spec = spec_for(f"s3://{pool_bucket}/{prefix}/")
    desired.put(spec)
    with pytest.raises(ColdStartFailed, match="missing object") as err:
        await manager.acquire(spec, request_id="m1", prefix_key=None, prompt_tokens=1, timeout_s=60)
    assert err.value.status == 503
    status = manager.revision_status(spec.revision_id)
    assert status.state == "failed" and "missing object" in status.last_error
    with pytest.raises(ColdStartFailed, match="missing object"):   # during backoff: answered at once
        await manager.acquire(spec, request_id="m2", prefix_key=None, prompt_tokens=1, timeout_s=60)
    desired.remove(spec.revision_id)


async def test_unknown_revision_is_refused(pool):
    manager, _, _, uri, _ = pool
    with pytest.raises(ColdStartFailed, match="not in the desired state"):
        await manager.acquire(spec_for(uri), request_id="u1", prefix_key=None, prompt_tokens=1, timeout_s=1)


async def test_deploy_time_fit_check(pool):
    manager, _, _, uri, _ = pool
    info = await manager.inspect_model(uri)
    assert info.architecture == "LlamaForCausalLM" and info.weight_bytes > 0
    manager.check_fits(info, ReplicaShape(gpu_memory_gb=0.5, gpu_count=1))
    manager.check_fits(info, spec_for(uri).shape)
    with pytest.raises(NeverFits) as err:
        manager.check_fits(info, ReplicaShape(gpu_memory_gb=2, gpu_count=1))       # slots have 1 GiB
    assert err.value.status == 422 and "largest slot has 1.00 GiB" in str(err.value)
    with pytest.raises(NeverFits):
        manager.check_fits(info, ReplicaShape(gpu_memory_gb=0.1, gpu_count=3))     # the node has 2 slots


async def test_waiting_for_capacity_then_placed_when_a_drained_replica_stops(pool):
    manager, desired, events, uri, _ = pool
    big = dict(gpu_memory_gb=0.6, idle_timeout_s=60)          # one per 1 GiB slot
    a, b, c = (spec_for(uri, **big) for _ in range(3))
    for spec in (a, b, c):
        desired.put(spec)
    lease_a = await manager.acquire(a, request_id="a1", prefix_key=None, prompt_tokens=4, timeout_s=120)
    async with await manager.acquire(b, request_id="b1", prefix_key=None, prompt_tokens=4, timeout_s=120):
        pass
    with pytest.raises(ColdStartTimeout) as err:
        await manager.acquire(c, request_id="c1", prefix_key=None, prompt_tokens=4, timeout_s=0.5)
    # nothing of c is loading yet (it waits for a slot), so the longer of the two hints
    assert err.value.status == 503 and err.value.retry_after_s == 5.0
    status = manager.revision_status(c.revision_id)
    assert status.state == "waiting_for_capacity"
    assert "waiting for capacity" in status.replicas[0].reason

    desired.remove(a.revision_id)                              # a is retired: drains, then stops
    await manager.refresh()
    assert manager.revision_status(a.revision_id).replicas[0].state == "draining"
    assert (await complete(lease_a))["usage"]["completion_tokens"] == 8   # in flight finishes
    assert manager.revision_status(c.revision_id).state == "waiting_for_capacity"
    lease_a.release()
    async with await manager.acquire(c, request_id="c2", prefix_key=None, prompt_tokens=4, timeout_s=120) as lc:
        assert (await complete(lc))["usage"]["completion_tokens"] == 8
    assert await events.wait_for(lambda _: "stopped" in events.states(lease_a.replica_id), 10)
    assert events.states(lease_a.replica_id)[-2:] == ["draining", "stopped"]
    for spec in (b, c):
        desired.remove(spec.revision_id)
    await manager.refresh()
    for spec in (b, c):
        assert await wait_no_live_replicas(manager, spec.revision_id)


async def test_tensor_parallel_replica_spans_two_slots_and_is_replaced_whole(pool):
    manager, desired, events, uri, _ = pool
    spec = spec_for(uri, gpu_count=2, idle_timeout_s=30)      # both CPU slots, tensor_parallel_size=2
    desired.put(spec)
    async with await manager.acquire(spec, request_id="tp1", prefix_key=None, prompt_tokens=4,
                                     timeout_s=120) as lease:
        text = (await complete(lease))["choices"][0]["text"]
        async with httpx.AsyncClient(timeout=10) as client:
            health = (await client.get(f"{lease.base_url}/health")).json()
    assert text and health["tensor_parallel"]["size"] == 2
    (worker_pid,) = health["tensor_parallel"]["worker_pids"]
    ready = next(e for e in events.events if e.replica_id == lease.replica_id and e.state == "ready")
    assert len(ready.slot_ids) == 2

    handle = manager.handle(lease.replica_id)
    os.kill(worker_pid, signal.SIGKILL)                # one rank dies: the whole replica goes
    ok = await events.wait_for(lambda evs: any(e.replica_id == lease.replica_id and e.state == "failed"
                                               for e in evs), 30)
    assert ok
    failed = next(r for r in manager.revision_status(spec.revision_id).replicas
                  if r.replica_id == lease.replica_id)
    assert "exited with code 3" in failed.reason       # runtime.model_host.EXIT_WORKER_DIED
    assert not handle.is_alive()

    async with await manager.acquire(spec, request_id="tp2", prefix_key=None, prompt_tokens=4,
                                     timeout_s=120) as fresh:
        assert fresh.replica_id != lease.replica_id and fresh.cold_start is not None
        assert (await complete(fresh))["choices"][0]["text"] == text
    desired.remove(spec.revision_id)
    await manager.refresh()
    assert await wait_no_live_replicas(manager, spec.revision_id)
