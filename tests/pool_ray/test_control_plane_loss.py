"""A control plane that dies never leaks GPUs: its replica actors are owned by
its Ray driver, so Ray kills them when the driver goes, and each runtime
process dies with its actor (PR_SET_PDEATHSIG)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.pool_ray.conftest import GPUS_PER_NODE, gpus_free, wait_until
from tests.pool_ray.test_node_loss import process_gone

pytestmark = [pytest.mark.timeout(240), pytest.mark.asyncio(loop_scope="session")]

DRIVER = textwrap.dedent("""
    import asyncio, json, os, sys
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from pathlib import Path
    from pool.api import RevisionSpec
    from pool.backends.ray import RayBackend
    from pool.settings import PoolSettings

    async def main(address, model, cache):
        ray.init(address=address, _node_ip_address="127.0.0.1", log_to_driver=False)
        backend = RayBackend(PoolSettings(cache_dir=Path(cache), runtime_threads=1))
        await backend.start()
        slot = (await backend.inventory())[0]
        spec = RevisionSpec("rev-orphan", "dep", "ten", "s3://unused/", engine={"device": "cpu"})
        handle = await backend.start_replica(spec, [slot], Path(model), "orphan")
        print(json.dumps({"pid": handle.pid, "node": handle.node_id}), flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main(*sys.argv[1:]))
""")


async def test_killed_control_plane_frees_its_gpus_and_processes(cluster, tiny_model, tmp_path):
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, cluster.cluster.address, str(tiny_model),
                               str(tmp_path / "cache")], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2], start_new_session=True)
    try:
        started = json.loads(driver.stdout.readline() or "{}")
        assert started, f"driver exited with {driver.wait(30)}"
        assert gpus_free() == 2 * GPUS_PER_NODE - 1
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)
        assert await wait_until(lambda: gpus_free() == 2 * GPUS_PER_NODE, 60), gpus_free()
        assert await wait_until(lambda: process_gone(started["pid"]), 30), "runtime outlived its control plane"
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(30)
