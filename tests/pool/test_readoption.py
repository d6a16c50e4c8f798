"""A control-plane crash and the pool that starts after it, with real runtime processes.

The first pool serves three revisions and keeps a warm standby; then it "crashes": it
is abandoned the way a SIGKILL leaves it (its tasks stop, nothing is shut down, its
processes run on in their own sessions and stay registered in the state dir). Before
the second pool starts on the same state dir, one replica's process is killed and one
revision is undeployed. The second pool, before it takes a request, adopts the wanted
replica (same process, same slots, same secret, no cold start), stops the unwanted one
and the old standby, forgets the dead one, and its first heartbeat lists only what it
holds. Heartbeats and the final `stopped` event carry the replica's own token counts.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import uuid
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from pool.adoption import ADOPTED
from pool.api import RevisionSpec, TenantQuota
from pool.in_memory import EventLog, InMemoryDesiredState
from pool.manager import PoolManager
from pool.processes import process_start_ticks
from pool.s3 import open_client
from tests.support.replica_client import replica_http
from tests.pool.conftest import make_settings
from tests.support.pool_calls import complete, spec_for
from tests.support.waiting import eventually
from tests.support.clock import SteppedClock
from tests.support.local_index import local_index
from tests.support.model_factory import upload_model

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="session")]
PROBE = Path(__file__).resolve().parents[1] / "functions" / "packages" / "probe"


def abandon(manager: PoolManager) -> None:
    """What a SIGKILL of the control plane leaves of its pool: no task runs on, nothing is
    stopped, the processes stay registered (the kernel would release the state dir's lock)."""
    for task in (manager._ticker, manager._events._sender, *manager._tasks._tasks):
        if task is not None:
            task.cancel()
    manager.backend.detach()


def gone(pid: int) -> bool:
    return process_start_ticks(pid) is None          # exited (a zombie counts as gone)


async def test_a_pool_started_after_a_crash_adopts_stops_and_forgets(s3_server, pool_bucket, tiny_model,
                                                                      tmp_path):
    settings = make_settings(s3_server, tmp_path, cpu_slots=2, slot_memory_gb=1, warm_pool_size=1,
                             tick_s=0.2, runtime_threads=1, kv_cache_tokens_default=512, heartbeat_s=0.5,
                             load_timeout_s=120, pull_timeout_s=60)
    uri = upload_model(tiny_model, s3_server.client(), pool_bucket, f"{uuid.uuid4().hex[:8]}/tiny")
    kept, unwanted, dead = (spec_for(uri) for _ in range(3))
    desired = InMemoryDesiredState([kept, unwanted, dead])
    async with AsyncExitStack() as stack:
        s3 = await open_client(settings, stack)
        first_events = EventLog()
        first = PoolManager(settings, desired, first_events, s3_client=s3, clock=SteppedClock())
        await first.start()
        try:
            held = await serve_three_then_crash(first, first_events, (kept, unwanted, dead))
        except BaseException:
            await first.stop()
            raise
        try:
            os.kill(held.pids[dead.revision_id], signal.SIGKILL)
            desired.remove(unwanted.revision_id)
            second_events = EventLog()
            second = PoolManager(settings, desired, second_events, s3_client=s3, clock=SteppedClock())
            await second.start()
            try:
                await check_the_restart(second, second_events, held, kept, unwanted, dead)
            finally:
                await second.stop()
            check_the_stop(second_events, held.ids[kept.revision_id], settings.replica_state_dir)
        finally:
            for proc in list(first.backend._all.values()):
                proc.kill_now()                    # only if the second pool left any


class Held:
    """What the first pool had when it crashed."""
    def __init__(self) -> None:
        self.ids: dict[str, str] = {}              # revision -> replica id
        self.pids: dict[str, int] = {}
        self.slots: dict[str, tuple[str, ...]] = {}
        self.headers: dict[str, dict[str, str]] = {}
        self.standby_pids: list[int] = []
        self.prompt_tokens = 0


async def serve_three_then_crash(first: PoolManager, events: EventLog, specs) -> Held:
    held = Held()
    leases = await asyncio.gather(*(first.acquire(s, request_id=f"a-{i}", prefix_key=None, prompt_tokens=4,
                                                  timeout_s=120) for i, s in enumerate(specs)))
    served = await complete(leases[0])
    held.prompt_tokens = served["usage"]["prompt_tokens"]
    for spec, lease in zip(specs, leases):
        lease.release()
        rid = held.ids[spec.revision_id] = lease.replica_id
        held.pids[spec.revision_id] = first.handle(rid).process.pid
        held.headers[spec.revision_id] = dict(lease.headers)
        first_event = next(e for e in events.events if e.replica_id == rid and e.slot_ids)
        assert first_event.state == "pulling", "GPU time starts when placement reserves the slots"
        held.slots[spec.revision_id] = first_event.slot_ids
    await eventually(lambda: any(set(b.replica_ids) == set(held.ids.values()) for b in events.beats),
                     timeout_s=30, what="a heartbeat lists the adopted replicas")
    await eventually(lambda: any(w.ready.done() for w in first.backend._warm),
                     timeout_s=120, what="a warm standby is ready")
    held.standby_pids = [w.process.pid for w in first.backend._warm]
    abandon(first)
    return held


async def check_the_restart(second: PoolManager, events: EventLog, held: Held, kept, unwanted, dead) -> None:
    kept_id = held.ids[kept.revision_id]
    # adopted: the same process, ready on the same slots, announced with them
    assert second.handle(kept_id).process.pid == held.pids[kept.revision_id]
    assert [(r.replica_id, r.state) for r in second.revision_status(kept.revision_id).replicas] == \
        [(kept_id, "ready")]
    assert [(e.replica_id, e.state, e.reason, e.slot_ids) for e in events.events] == \
        [(kept_id, "ready", ADOPTED, held.slots[kept.revision_id])]
    (slot_id,) = held.slots[kept.revision_id]
    reserved = {s.slot_id: s.reserved_bytes for s in second.capacity.states()}
    assert reserved[slot_id] > 0, "its slot is booked: nothing new lands on top of it"
    # the first heartbeat, queued before start() returned, lists only it, with its counters
    assert await events.wait_for(lambda _: events.beats, 10)
    assert events.beats[0].replica_ids == (kept_id,)
    assert events.beats[0].tokens == {kept_id: (held.prompt_tokens, 8)}
    # the unwanted replica and the old standby were stopped, the dead one forgotten
    assert gone(held.pids[unwanted.revision_id]) and all(gone(pid) for pid in held.standby_pids)
    for spec in (unwanted, dead):
        assert not second.revision_status(spec.revision_id).replicas
    # it serves with its own secret, without a cold start or a second process
    async with await second.acquire(kept, request_id="b-1", prefix_key=None, prompt_tokens=4,
                                    timeout_s=30) as lease:
        assert (lease.replica_id, lease.cold_start, dict(lease.headers)) == \
            (kept_id, None, held.headers[kept.revision_id])
        assert (await complete(lease))["usage"]["completion_tokens"] == 8
        async with replica_http(base_url=lease.base_url, timeout=10) as client:
            assert (await client.get("/stats")).status_code == 401          # its counters need its secret
            stats = (await client.get("/stats", headers=lease.headers)).json()
        assert stats == {"model": kept.revision_id, "requests": 2, "prompt_tokens": 2 * held.prompt_tokens,
                         "completion_tokens": 16}
    assert await events.wait_for(lambda _: events.beats[-1].tokens.get(kept_id, (0, 0))[1] == 16, 10)
    assert {e.replica_id for e in events.events} == {kept_id}, "no replica was started"


def check_the_stop(events: EventLog, kept_id: str, state_dir) -> None:
    stopped = events.events[-1]
    assert (stopped.replica_id, stopped.state) == (kept_id, "stopped")
    assert stopped.completion_tokens == 16 and stopped.prompt_tokens == 2 * (events.beats[0].tokens[kept_id][0])
    assert events.beats[-1].replica_ids == (), "the pool's last heartbeat: nothing holds slots"
    assert not list((state_dir / "local").glob("*.json")), "every process it stopped is unregistered"


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox needs root (no root here)")


@needs_root
async def test_an_adopted_function_replica_still_reaches_its_granted_host(s3_server, pool_bucket, tmp_path):
    """Its egress proxy lived in the crashed pool's process; the next pool starts it again."""
    settings = make_settings(s3_server, tmp_path, cpu_slots=1, slot_memory_gb=1, warm_pool_size=0,
                             tick_s=0.2, heartbeat_s=0.5, load_timeout_s=120, pull_timeout_s=60)
    (tmp_path / "www").mkdir()
    package = tmp_path / "probe"
    shutil.copytree(PROBE, package)
    manifest = package / "thawpool.toml"                # each call answered at once, not batched
    manifest.write_text(manifest.read_text().replace("max_wait_ms = 60000", "max_wait_ms = 0"))
    uri = upload_model(package, s3_server.client(), pool_bucket, f"{uuid.uuid4().hex[:8]}/probe")
    with local_index(tmp_path / "none", tmp_path / "www") as granted:
        host = granted.split("/")[2]
        spec = RevisionSpec(f"rev-{uuid.uuid4().hex[:8]}", "dep-fn", "tenant-fn", uri, gpu_memory_gb=0.25,
                            kind="function", quota=TenantQuota(egress=(host,)))
        desired = InMemoryDesiredState([spec])
        async with AsyncExitStack() as stack:
            s3 = await open_client(settings, stack)
            first = PoolManager(settings, desired, EventLog(), s3_client=s3, clock=SteppedClock())
            await first.start()
            try:
                before = await fetch_through(first, spec, granted)
            except BaseException:
                await first.stop()
                raise
            abandon(first)
            second = PoolManager(settings, desired, EventLog(), s3_client=s3, clock=SteppedClock())
            await second.start()
            try:
                after = await fetch_through(second, spec, granted)
            finally:
                await second.stop()
                for proc in list(first.backend._all.values()):
                    proc.kill_now()                # only if the second pool left any
    assert before["answer"] == after["answer"] == {"status": 200}
    assert after["pid"] == before["pid"], "the same process, adopted, not a new cold start"


async def fetch_through(manager: PoolManager, spec: RevisionSpec, url: str) -> dict:
    async with await manager.acquire(spec, request_id=uuid.uuid4().hex, prefix_key=None, prompt_tokens=0,
                                     timeout_s=120) as lease:
        pid = manager.handle(lease.replica_id).process.pid
        async with replica_http(timeout=60, headers=lease.headers) as client:
            answer = await client.post(f"{lease.base_url}/invoke", json={"input": {"fetch": url}})
    assert answer.status_code == 200, answer.text
    return {"answer": answer.json()["output"], "pid": pid}
