"""PoolManager end to end on this machine: real SeaweedFS S3, real runtime.serve.server processes.

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
from pathlib import Path

import httpx
import pytest

from pool.api import (ColdStartFailed, ColdStartTimeout, ModelUnavailable, NeverFits, QueueFull, QuotaExceeded,
                      ReplicaShape, RevisionSpec, TenantQuota)
from pool.in_memory import EventLog, InMemoryDesiredState
from pool.manager import PoolManager
from spec.engine_options import ChosenOptions
from tests.support.pool_calls import IDLE_TIMEOUT_S, PROMPT, complete, spec_for
from tests.support.replica_client import host_pid, replica_http
from tests.support.waiting import eventually
from tests.pool.conftest import FlakyS3, make_settings
from tests.support.clock import SteppedClock
from tests.support.model_factory import upload_model

pytestmark = [pytest.mark.timeout(240), pytest.mark.asyncio(loop_scope="session")]


async def undeploy(manager: PoolManager, desired: InMemoryDesiredState, spec: RevisionSpec) -> None:
    """The revision out of the desired state, and every replica of it gone."""
    desired.remove(spec.revision_id)
    await manager.refresh()
    assert await wait_no_live_replicas(manager, spec.revision_id)


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
        async with replica_http(timeout=30, headers=lease.headers) as client:
            async with client.stream("POST", f"{lease.base_url}/v1/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data:") and not got_first:
                        got_first = True
                        os.kill(pid, signal.SIGKILL)
    assert got_first
    lease.mark_failed()
    lease.release()
    # at once, before the check of the failed replica has run: not routed to it
    async with await manager.acquire(spec, request_id="k2", prefix_key=None, prompt_tokens=4, timeout_s=120) as fresh:
        assert fresh.replica_id != lease.replica_id and fresh.cold_start is not None
        assert (await complete(fresh))["usage"]["completion_tokens"] == 8
    ok = await events.wait_for(lambda evs: any(e.replica_id == lease.replica_id and e.state == "failed"
                                               for e in evs), 10)
    assert ok
    failed = next(r for r in manager.revision_status(spec.revision_id).replicas if r.replica_id == lease.replica_id)
    assert "exited with code -9" in failed.reason
    await undeploy(manager, desired, spec)


async def test_a_healthy_replica_a_request_failed_on_serves_again_once_checked(pool):
    manager, desired, events, uri, _ = pool
    spec = spec_for(uri, idle_timeout_s=30)
    desired.put(spec)
    async with await manager.acquire(spec, request_id="h1", prefix_key=None, prompt_tokens=4,
                                     timeout_s=120) as first:
        first.mark_failed()                    # e.g. a client's own error: the replica is fine
    async with await manager.acquire(spec, request_id="h2", prefix_key=None, prompt_tokens=4,
                                     timeout_s=120) as again:
        assert again.replica_id == first.replica_id and again.cold_start is None
        assert (await complete(again))["usage"]["completion_tokens"] == 8
    await undeploy(manager, desired, spec)


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
    (c_replica,) = events.replica_ids(c.revision_id)
    assert [(e.state, e.slot_ids) for e in events.events if e.replica_id == c_replica] == [("pending", ())], \
        "no slots, so no GPU time, while it waits"

    desired.remove(a.revision_id)                              # a is retired: drains, then stops
    await manager.refresh()
    assert manager.revision_status(a.revision_id).replicas[0].state == "draining"
    assert (await complete(lease_a))["usage"]["completion_tokens"] == 8   # in flight finishes
    assert manager.revision_status(c.revision_id).state == "waiting_for_capacity"
    lease_a.release()
    async with await manager.acquire(c, request_id="c2", prefix_key=None, prompt_tokens=4, timeout_s=120) as lc:
        assert (await complete(lc))["usage"]["completion_tokens"] == 8
    placed = [e for e in events.events if e.replica_id == c_replica and e.slot_ids]
    assert placed[0].state == "pulling", "its GPU time starts when placement reserves its slot"
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
        async with replica_http(timeout=10, headers=lease.headers) as client:
            health = (await client.get(f"{lease.base_url}/health")).json()
    assert text and health["tensor_parallel"]["size"] == 2
    (worker_pid,) = health["tensor_parallel"]["worker_pids"]
    ready = next(e for e in events.events if e.replica_id == lease.replica_id and e.state == "ready")
    assert len(ready.slot_ids) == 2

    handle = manager.handle(lease.replica_id)
    os.kill(host_pid(worker_pid, handle.process.pid), signal.SIGKILL)   # one rank dies: the replica goes
    ok = await events.wait_for(lambda evs: any(e.replica_id == lease.replica_id and e.state == "failed"
                                               for e in evs), 30)
    assert ok
    failed = next(r for r in manager.revision_status(spec.revision_id).replicas
                  if r.replica_id == lease.replica_id)
    assert "exited with code 3" in failed.reason       # runtime.serve.model_host.EXIT_WORKER_DIED
    assert not handle.is_alive()

    async with await manager.acquire(spec, request_id="tp2", prefix_key=None, prompt_tokens=4,
                                     timeout_s=120) as fresh:
        assert fresh.replica_id != lease.replica_id and fresh.cold_start is not None
        assert (await complete(fresh))["choices"][0]["text"] == text
    await undeploy(manager, desired, spec)


async def test_a_replica_answers_only_calls_that_carry_its_secret(pool):
    manager, desired, _, uri, _ = pool
    spec = spec_for(uri, idle_timeout_s=30)
    desired.put(spec)
    async with await manager.acquire(spec, request_id="s1", prefix_key=None, prompt_tokens=4,
                                     timeout_s=120) as lease:
        body = {"model": lease.revision_id, "prompt": PROMPT, "max_tokens": 2}
        async with replica_http(base_url=lease.base_url, timeout=60) as client:
            for headers in ({}, {"Authorization": "Bearer not-the-secret"}):
                refused = await client.post("/v1/completions", json=body, headers=headers)
                assert refused.status_code == 401, refused.text
                assert refused.json()["error"]["type"] == "authentication_error"
                assert (await client.post("/admin/load", json={"model": "/etc"}, headers=headers)).status_code == 401
            assert (await client.get("/health")).status_code == 200          # the one open path
            assert (await client.post("/v1/completions", json=body, headers=lease.headers)).status_code == 200
        secret = lease.headers["Authorization"].removeprefix("Bearer ").encode()
        process = manager.handle(lease.replica_id).process
        assert secret not in Path(f"/proc/{process.pid}/cmdline").read_bytes()   # never on the command line
        assert secret not in process.log_path.read_bytes()                       # nor in its log
    await undeploy(manager, desired, spec)


async def test_a_tenant_at_its_gpu_quota_gets_429_while_another_tenant_thaws(pool):
    """Two slots. Tenant A (quota: one GPU, two queued requests) holds one; its second
    revision's replica waits for A's quota and leaves the free slot to tenant B; A's
    requests then get 429, until A's first replica stops and the waiting one is placed."""
    manager, desired, events, uri, _ = pool
    quota = TenantQuota(max_gpus=1, max_queued_requests=2)
    a1, a2, a3 = (spec_for(uri, tenant_id="ten-a", quota=quota, idle_timeout_s=60) for _ in range(3))
    b1 = spec_for(uri, tenant_id="ten-b", idle_timeout_s=60)
    for spec in (a1, a2, a3, b1):
        desired.put(spec)
    lease_a1 = await manager.acquire(a1, request_id="a1", prefix_key=None, prompt_tokens=4, timeout_s=120)
    over_quota = asyncio.ensure_future(manager.acquire(a2, request_id="a2-1", prefix_key=None,
                                                       prompt_tokens=4, timeout_s=2.0))
    await eventually(lambda: manager.revision_status(a2.revision_id).state == "waiting_for_capacity",
                     timeout_s=30, what="the second revision waits for capacity")
    thaw_b = asyncio.ensure_future(manager.acquire(b1, request_id="b1", prefix_key=None, prompt_tokens=4,
                                                   timeout_s=120))   # later in line, but A may not grow
    with pytest.raises(QuotaExceeded) as over:
        await over_quota
    assert over.value.status == 429 and over.value.retry_after_s > 0
    waiting = manager.revision_status(a2.revision_id)
    assert waiting.state == "waiting_for_capacity"
    assert "waiting for GPU quota: tenant ten-a holds 1 of its 1 GPU(s)" in waiting.replicas[0].reason

    async with await thaw_b as lease_b:             # B thawed on the slot A's replica may not take
        assert lease_b.cold_start is not None and lease_b.headers != lease_a1.headers
        assert (await complete(lease_b))["usage"]["completion_tokens"] == 8
    queued = [asyncio.ensure_future(manager.acquire(a2, request_id=f"a2-q{i}", prefix_key=None,
                                                    prompt_tokens=4, timeout_s=120)) for i in range(2)]
    await eventually(lambda: manager.revision_status(a2.revision_id).queued_requests == 2,
                     timeout_s=30, what="two requests queued")
    with pytest.raises(QueueFull, match="tenant ten-a: 2 requests already wait"):   # across A's revisions
        await manager.acquire(a3, request_id="a3-1", prefix_key=None, prompt_tokens=4, timeout_s=120)
    (a2_replica,) = events.replica_ids(a2.revision_id)
    assert events.states(a2_replica) == ["pending"]

    desired.remove(a1.revision_id)                 # A lets go of its GPU: its waiting replica takes it
    await manager.refresh()
    lease_a1.release()
    for lease in await asyncio.gather(*queued):
        async with lease:
            assert lease.replica_id == a2_replica
            assert (await complete(lease))["usage"]["completion_tokens"] == 8
    for spec in (a1, a2, a3, b1):
        desired.remove(spec.revision_id)
    await manager.refresh()
    for spec in (a1, a2, b1):
        assert await wait_no_live_replicas(manager, spec.revision_id)


async def test_a_draft_model_is_pulled_by_uri_cached_and_released_with_its_replica(
        pool, s3_server, pool_bucket, model_factory):
    manager, desired, events, uri, _ = pool
    draft_dir = model_factory(arch="llama", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                              num_key_value_heads=1, seed=1)
    draft_uri = upload_model(draft_dir, s3_server.client(), pool_bucket, f"{uuid.uuid4().hex[:8]}/draft")
    engine = ChosenOptions({"kv_cache_tokens": 512, "speculative": {"method": "draft", "model": draft_uri, "k": 4}})
    spec = spec_for(uri, engine=engine, idle_timeout_s=30)
    desired.put(spec)
    info = await manager.inspect_model(uri)
    manager.check_fits(info, spec.shape)
    by_path = engine.with_(speculative={**engine["speculative"], "model": str(draft_dir)})
    with pytest.raises(ModelUnavailable, match="must be a model URI"):
        manager.check_fits(info, ReplicaShape(0.25, 1, by_path))

    async with await manager.acquire(spec, request_id="d1", prefix_key=None, prompt_tokens=4,
                                     timeout_s=120) as lease:
        assert (await complete(lease, max_tokens=16, ignore_eos=True))["usage"]["completion_tokens"] == 16
        async with replica_http(timeout=10, headers=lease.headers) as client:
            metrics = (await client.get(f"{lease.base_url}/metrics")).text
        model_files, draft_files = manager._registry.replica(lease.replica_id).files
        draft_keys = set(draft_files.keys)
    assert sample(metrics, "thawpool_spec_decode_num_draft_tokens_total") > 0     # the draft ran
    assert (draft_files.model_dir / "config.json").read_text() == (draft_dir / "config.json").read_text()
    cache = manager._running.weights.cache
    assert draft_keys <= set(cache._pins)                  # pinned while the replica lives
    await undeploy(manager, desired, spec)
    assert not draft_keys & set(cache._pins)               # released with it, still cached
    assert all((cache.objects / key / "data").is_file() for key in draft_keys)

    by_path_spec = spec_for(uri, engine=by_path)
    desired.put(by_path_spec)
    with pytest.raises(ColdStartFailed, match="engine.speculative.model: the draft model must be a model URI"):
        await manager.acquire(by_path_spec, request_id="d2", prefix_key=None, prompt_tokens=4, timeout_s=60)
    desired.remove(by_path_spec.revision_id)
    await manager.refresh()


def sample(metrics_text: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return next(s.value for f in text_string_to_metric_families(metrics_text) for s in f.samples if s.name == name)


async def test_weights_swapped_after_deploy_are_refused_before_placement(pool, s3_server, pool_bucket, tiny_model,
                                                                          model_factory):
    """A revision pins the bytes its deploy read: a bigger model put under the same keys
    since (and read by a later deploy of the same URI) never sizes or loads its replicas."""
    manager, desired, events, _, _ = pool
    prefix = f"{uuid.uuid4().hex[:8]}/swapped"
    uri = upload_model(tiny_model, s3_server.client(), pool_bucket, prefix)
    spec = spec_for(uri, pins=(await manager.inspect_model(uri)).objects)
    bigger = model_factory(arch="llama", hidden_size=128, num_hidden_layers=4, seed=2)
    s3_server.client().upload_file(str(bigger / "model.safetensors"), pool_bucket, f"{prefix}/model.safetensors")
    assert (await manager.inspect_model(uri)).num_parameters > 2 * param_count(tiny_model)
    desired.put(spec)
    with pytest.raises(ColdStartFailed, match=rf"{prefix}/model.safetensors changed since its revision was deployed"):
        await manager.acquire(spec, request_id="s1", prefix_key=None, prompt_tokens=1, timeout_s=60)
    mine = [e for e in events.events if e.revision_id == spec.revision_id]
    assert [e.state for e in mine][-1] == "failed" and not any(e.slot_ids for e in mine)   # never placed
    desired.remove(spec.revision_id)
    await manager.refresh()


def param_count(model_dir) -> int:
    from safetensors.numpy import load_file

    return sum(t.size for t in load_file(str(model_dir / "model.safetensors")).values())
