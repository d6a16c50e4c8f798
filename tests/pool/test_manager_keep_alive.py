"""The learned keep-alive in the real pool (PoolSettings.keep_alive = "learned"): real S3,
real runtime processes, the pool's clock stepped by the test.

Ten calls a hundred seconds apart teach the revision that its next call comes 60-120 s
after the last one ends (pool/keep_alive.py: a window from 54 s to 132 s of idleness).
Then its replica goes at once instead of after its 600 s idle timeout, a replica is
started again at the window's opening with no call waiting for it, and it goes again
once the window has passed.
"""
from __future__ import annotations

import uuid

import pytest

from pool.in_memory import EventLog
from pool.keep_alive import IdleWindow, learn
from tests.pool.conftest import make_settings, running_manager
from tests.support.model_factory import upload_model
from tests.support.pool_calls import complete, spec_for

pytestmark = [pytest.mark.timeout(240), pytest.mark.asyncio(loop_scope="session")]


@pytest.fixture
async def learning_pool(s3_server, pool_bucket, tiny_model, tmp_path):
    settings = make_settings(s3_server, tmp_path, cpu_slots=1, slot_memory_gb=1, warm_pool_size=1,
                             tick_s=0.2, scale_down_delay_s=0.5, runtime_threads=1, keep_alive="learned",
                             kv_cache_tokens_default=512, load_timeout_s=120, pull_timeout_s=60)
    uri = upload_model(tiny_model, s3_server.client(), pool_bucket, f"{uuid.uuid4().hex[:8]}/tiny")
    events = EventLog()
    async with running_manager(settings, events) as (manager, desired):
        yield manager, desired, events, uri


def replicas_in(events, state):
    return {e.replica_id for e in events.events if e.state == state}


async def test_learned_window_lets_go_at_once_then_prewarms_with_no_call(learning_pool):
    manager, desired, events, uri = learning_pool
    spec = spec_for(uri)
    desired.put(spec)
    for i in range(11):                       # ten idle spells of 100 s between eleven calls
        if i:
            manager.clock.advance(100.0)
        async with await manager.acquire(spec, request_id=f"r{i}", prefix_key=None, prompt_tokens=4,
                                         timeout_s=120) as lease:
            await complete(lease)
    rev = manager._registry.get(spec.revision_id)
    assert rev is not None and rev.idle_times.samples == 10
    assert learn(rev.idle_times) == IdleWindow(prewarm_s=60 * 0.9, until_s=120 * 1.1)
    first = lease.replica_id

    await manager.tick()                      # idle, before the window: no replica wanted
    assert await events.wait_for(lambda _: first in replicas_in(events, "stopped"), 30)

    manager.clock.advance(60.0)               # the window opens: a replica with no call
    await manager.tick()
    assert await events.wait_for(lambda _: replicas_in(events, "ready") - {first}, 120)
    prewarmed = (replicas_in(events, "ready") - {first}).pop()

    async with await manager.acquire(spec, request_id="in-window", prefix_key=None, prompt_tokens=4,
                                     timeout_s=30) as lease:
        assert lease.cold_start is None and lease.replica_id == prewarmed
        await complete(lease)

    manager.clock.advance(140.0)              # past the window after that call
    await manager.tick()
    assert await events.wait_for(lambda _: prewarmed in replicas_in(events, "stopped"), 30)
