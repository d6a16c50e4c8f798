"""The sleep tier end to end on this machine: real SeaweedFS S3, real runtime.serve.server
processes, the pool's clock stepped by the test and its loop ticked by hand (tick_s is
an hour), so nothing here races the machine's speed.

An idle replica drains into sleep (its slot and its GPU time given back, its process
kept), a request wakes it with the same greedy answer, it stops after its sleep
timeout; a node's host-memory budget stops the oldest sleeper; a wake that fails (the
sleeper's process died) stops it and falls back to a cold start.
"""
from __future__ import annotations

import os
import signal
import uuid

import pytest

from pool.in_memory import EventLog
from pool.settings import GB
from tests.pool.conftest import make_settings, running_manager
from tests.support.pool_calls import complete, spec_for
from tests.support.model_factory import upload_model
from tests.support.waiting import eventually

pytestmark = [pytest.mark.timeout(240), pytest.mark.asyncio(loop_scope="session")]
IDLE_S, SLEEP_S = 600.0, 3600.0           # passed by SteppedClock.advance, never by waiting


@pytest.fixture(scope="module")
async def pool(s3_server, pool_bucket, tiny_model, tmp_path_factory):
    weights = (tiny_model / "model.safetensors").stat().st_size
    tmp = tmp_path_factory.mktemp("sleep-pool")
    # room for one sleeper of the tiny model on the node, not for two
    settings = make_settings(s3_server, tmp, cpu_slots=2, slot_memory_gb=1, warm_pool_size=0,
                             tick_s=3600, runtime_threads=1, kv_cache_tokens_default=512,
                             load_timeout_s=120, pull_timeout_s=60, heartbeat_s=1,
                             sleep_host_memory_gb=1.5 * weights / GB)
    uri = upload_model(tiny_model, s3_server.client(), pool_bucket, f"{uuid.uuid4().hex[:8]}/tiny")
    events = EventLog()
    async with running_manager(settings, events) as (manager, desired):
        yield manager, desired, events, uri


def sleepy_spec(uri):
    return spec_for(uri, idle_timeout_s=IDLE_S, sleep_timeout_s=SLEEP_S)


async def serve_one(manager, spec, request_id):
    async with await manager.acquire(spec, request_id=request_id, prefix_key=None, prompt_tokens=4,
                                     timeout_s=120) as lease:
        return lease, (await complete(lease))["choices"][0]["text"]


async def tick_until(manager, events, replica_id, state):
    async def reached():
        await manager.tick()
        return events.states(replica_id)[-1:] == [state]
    await eventually(reached, timeout_s=60, what=f"{replica_id} {state}", every_s=0.1)


def last_event(events, replica_id, state):
    return [e for e in events.events if e.replica_id == replica_id and e.state == state][-1]


async def test_an_idle_replica_sleeps_wakes_on_a_request_and_stops_after_its_sleep_timeout(pool):
    manager, desired, events, uri = pool
    spec = sleepy_spec(uri)
    desired.put(spec)
    cold, text = await serve_one(manager, spec, "s1")
    rid = cold.replica_id
    assert cold.cold_start.kind == "cold_start"

    manager.clock.advance(IDLE_S)
    await tick_until(manager, events, rid, "sleeping")
    assert events.states(rid) == ["pending", "pulling", "loading", "ready", "draining", "sleeping"]
    assert last_event(events, rid, "draining").slot_ids, "billed while it frees its memory"
    assert last_event(events, rid, "sleeping").slot_ids == (), "its GPU time ends here"
    assert manager.capacity.gpus_held() == {}, "its slot is free for others"
    assert manager.handle(rid).is_alive(), "its process stays"
    assert manager.revision_status(spec.revision_id).state == "sleeping"
    beats = len(events.beats)

    async def beaten():
        manager.clock.advance(2)              # past heartbeat_s
        await manager.tick()
        return len(events.beats) > beats
    await eventually(beaten, timeout_s=30, what="a heartbeat")
    assert rid not in events.beats[-1].replica_ids, "a sleeper is in no heartbeat"

    woken, again = await serve_one(manager, spec, "s2")
    assert woken.replica_id == rid and again == text
    assert woken.cold_start.kind == "wake" and "kv_cache_s" in woken.cold_start.load_stages
    assert events.states(rid)[-3:] == ["sleeping", "waking", "ready"]
    assert last_event(events, rid, "waking").slot_ids, "billed again from the wake"

    manager.clock.advance(IDLE_S)
    await tick_until(manager, events, rid, "sleeping")
    manager.clock.advance(SLEEP_S - 1)
    await manager.tick()
    assert events.states(rid)[-1] == "sleeping", "kept until its sleep timeout"
    manager.clock.advance(2)
    await tick_until(manager, events, rid, "stopped")
    assert f"asleep for {SLEEP_S:g}s" in last_event(events, rid, "stopped").reason
    assert manager.revision_status(spec.revision_id).state == "scaled_to_zero"
    desired.remove(spec.revision_id)


async def test_the_host_memory_budget_stops_the_oldest_sleeper_and_a_failed_wake_cold_starts(pool):
    manager, desired, events, uri = pool
    first, second = sleepy_spec(uri), sleepy_spec(uri)
    desired.put(first)
    desired.put(second)
    older, _ = await serve_one(manager, first, "b1")
    manager.clock.advance(IDLE_S / 2)
    newer, text = await serve_one(manager, second, "b2")

    manager.clock.advance(IDLE_S / 2)          # only the first revision is idle
    await tick_until(manager, events, older.replica_id, "sleeping")
    manager.clock.advance(IDLE_S / 2)
    await tick_until(manager, events, newer.replica_id, "sleeping")
    await tick_until(manager, events, older.replica_id, "stopped")
    assert "host-memory budget" in last_event(events, older.replica_id, "stopped").reason

    os.kill(manager.handle(newer.replica_id).process.pid, signal.SIGKILL)
    await eventually(lambda: not manager.handle(newer.replica_id).is_alive(), timeout_s=10, what="killed")
    fresh, again = await serve_one(manager, second, "b3")
    assert fresh.replica_id != newer.replica_id and again == text
    assert fresh.cold_start.kind == "cold_start"
    assert events.states(newer.replica_id)[-2:] == ["waking", "stopped"]
    assert "wake failed, a cold start instead" in last_event(events, newer.replica_id, "stopped").reason
    assert manager.capacity.gpus_held() == {"ten-1": 1}, "the failed wake gave its slot back"
    desired.remove(first.revision_id)
    desired.remove(second.revision_id)
