"""A control plane that dies leaves its replicas running, and the next one adopts them.

Replica actors are detached and named in the pool's namespace: when the control
plane's driver is SIGKILLed they keep their GPUs and their runtime processes. A
PoolManager started afterwards on the same namespace lists them before it takes a
request: the replica of a revision it still wants is adopted (same process, ready,
serving with its secret, no cold start), the other one is stopped and its GPU freed,
and its first heartbeat lists only what it holds. Stopping that pool frees everything.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from pool.in_memory import EventLog, InMemoryDesiredState
from pool.manager import PoolManager
from tests.pool.conftest import make_settings
from tests.pool_ray.conftest import GPUS_PER_NODE, gpus_free, wait_until
from tests.pool_ray.test_backend import CPU_ENGINE, complete, spec_for, wait_ready
from tests.pool_ray.test_node_loss import process_gone

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="session")]

DRIVER = textwrap.dedent("""
    import asyncio, json, os, sys
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from pathlib import Path
    from pool.api import RevisionSpec
    from spec.engine_options import ChosenOptions
    from pool.backends.ray import RayBackend
    from pool.cold_start import launch_for
    from pool.settings import PoolSettings

    async def main(address, model, cache, namespace, specs):
        ray.init(address=address, _node_ip_address="127.0.0.1", log_to_driver=False)
        backend = RayBackend(PoolSettings(cache_dir=Path(cache), runtime_threads=1, ray_namespace=namespace))
        await backend.start()
        slots = await backend.inventory()
        started = {}
        for slot, (name, spec) in zip(slots, json.loads(specs).items()):
            rid = f"{name}-{spec['revision_id']}"
            spec = RevisionSpec(**{**spec, "engine": ChosenOptions(spec["engine"])})
            launch = launch_for(spec, [slot], backend.settings, backend, folder=Path(model))
            handle = await backend.start_replica(spec, launch, [slot], rid)
            started[name] = {"replica_id": handle.replica_id, "pid": handle.pid, "base_url": handle.base_url}
        print(json.dumps(started), flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main(*sys.argv[1:]))
""")


class Reachable:
    """Enough of a handle for wait_ready: a base_url that answers /health."""
    def __init__(self, base_url: str):
        self.base_url = base_url

    def is_alive(self) -> bool:
        return True


async def test_a_pool_started_after_its_driver_died_adopts_what_it_wants(cluster, tiny_model, tmp_path, s3_server):
    namespace = f"tp-{uuid.uuid4().hex[:8]}"
    keep, drop = spec_for(engine=CPU_ENGINE), spec_for(engine=CPU_ENGINE)
    specs = {name: {**dataclasses.asdict(spec), "engine": spec.engine.to_json()}
             for name, spec in (("keep", keep), ("drop", drop))}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, cluster.cluster.address, str(tiny_model),
                               str(tmp_path / "cache"), namespace, json.dumps(specs)], stdout=subprocess.PIPE,
                              text=True, cwd=Path(__file__).resolve().parents[2], start_new_session=True)
    try:
        started = json.loads(driver.stdout.readline() or "{}")
        assert started, f"driver exited with {driver.wait(30)}"
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)
        for name in ("keep", "drop"):             # they outlive the driver, and finish loading
            assert await wait_ready(Reachable(started[name]["base_url"])), name
        assert gpus_free() == 2 * GPUS_PER_NODE - 2 and not process_gone(started["keep"]["pid"])
        await adopt_and_serve(cluster, s3_server, tmp_path, namespace, keep, started)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(30)
    assert await wait_until(lambda: gpus_free() == 2 * GPUS_PER_NODE, 60), gpus_free()
    assert await wait_until(lambda: all(process_gone(s["pid"]) for s in started.values()), 30)


async def adopt_and_serve(cluster, s3_server, tmp_path, namespace, keep, started) -> None:
    settings = make_settings(s3_server, tmp_path, backend="ray", ray_address=cluster.cluster.address,
                             ray_namespace=namespace, slot_memory_gb=1, warm_pool_size=0, tick_s=0.2,
                             runtime_threads=1, stop_timeout_s=5)
    events = EventLog()
    manager = PoolManager(settings, InMemoryDesiredState([keep]), events)
    await manager.start()
    try:
        kept_id = started["keep"]["replica_id"]
        assert manager.handle(kept_id).pid == started["keep"]["pid"]
        assert [(r.replica_id, r.state) for r in manager.revision_status(keep.revision_id).replicas] == \
            [(kept_id, "ready")]
        assert process_gone(started["drop"]["pid"]) or await wait_until(
            lambda: process_gone(started["drop"]["pid"]), 30)
        assert await wait_until(lambda: gpus_free() == 2 * GPUS_PER_NODE - 1, 30), gpus_free()
        assert await events.wait_for(lambda _: events.beats, 10)
        assert events.beats[0].replica_ids == (kept_id,)
        async with await manager.acquire(keep, request_id="r1", prefix_key=None, prompt_tokens=4,
                                         timeout_s=30) as lease:
            assert (lease.replica_id, lease.cold_start) == (kept_id, None)
            assert (await complete(lease, keep.revision_id))["usage"]["completion_tokens"] == 4
        assert {e.replica_id for e in events.events} == {kept_id}, "no replica was started"
    finally:
        await manager.stop()
    assert events.events[-1].state == "stopped" and events.events[-1].completion_tokens == 4
