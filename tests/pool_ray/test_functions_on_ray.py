"""Function deployments on the Ray backend: the probe package (tests/functions/packages/probe)
served by real `runtime.functions.server` processes in Ray actors.

- Through a PoolManager on Ray: the node pulls the package from S3 into its own cache,
  builds the package's venv under that cache (its own cold-start stage), and the
  function server runs with the venv's interpreter and a clean environment; a call
  with the replica's secret gets the handler's answer; stopping the pool stops it.
- A function replica outlives its pool like a model's: the next backend on the same
  namespace finds it, serving its revision with the same process and secret, and
  stops it.
- A venv that cannot be built on the node fails the start with the installer's reason
  and gives the GPU back.
"""
from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import httpx
import pytest

from pool.adoption import spec_fingerprint
from pool.api import ColdStartFailed, RevisionSpec
from pool.backends.ray import RayBackend
from pool.health import serves
from tests.pool_ray.conftest import GPUS_PER_NODE, gpus_free, ray_settings, start_on, wait_until
from tests.pool_ray.test_backend import wait_ready
from tests.pool_ray.test_manager_on_ray import pool_settings, running_pool
from tests.pool_ray.test_node_loss import process_gone
from tests.support.replica_client import host_pid
from tests.support.model_factory import upload_model

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="session")]
PROBE = Path(__file__).resolve().parents[1] / "functions" / "packages" / "probe"


def probe_package(folder: Path) -> Path:
    """The probe package, answering each call at once (a batch of one goes without waiting)."""
    shutil.copytree(PROBE, folder)
    manifest = folder / "thawpool.toml"
    manifest.write_text(manifest.read_text().replace("max_wait_ms = 60000", "max_wait_ms = 0"))
    return folder


def function_spec(uri: str) -> RevisionSpec:
    return RevisionSpec(f"rev-{uuid.uuid4().hex[:8]}", "dep-fn", "ten-ray", uri, gpu_memory_gb=0.25,
                        max_replicas=1, kind="function")


async def invoke(replica, item: dict) -> dict:
    """One call to a function replica (a handle or a lease), sent with its secret."""
    async with httpx.AsyncClient(timeout=60, headers=replica.headers) as client:
        resp = await client.post(f"{replica.base_url}/invoke", json={"input": item})
    assert resp.status_code == 200, resp.text
    return resp.json()["output"]


def command_line(pid: int) -> list[str]:
    """The argv of a process on this machine (every loopback node is this machine)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


async def test_a_function_runs_in_a_venv_built_on_its_node(cluster, s3_server, s3_bucket, tmp_path):
    uri = upload_model(probe_package(tmp_path / "probe"), s3_server.client(), s3_bucket,
                       f"{uuid.uuid4().hex[:8]}/probe")
    spec = function_spec(uri)
    settings = pool_settings(cluster, s3_server, tmp_path)
    async with running_pool(settings, [spec]) as (manager, _):
        async with await manager.acquire(spec, request_id="fn-1", prefix_key=None, prompt_tokens=0,
                                         timeout_s=120) as lease:
            handle = manager.handle(lease.replica_id)
            answer = await invoke(lease, {"echo": "hi"})
            seen = set((await invoke(lease, {"env": True}))["env"])
            assert lease.cold_start is not None and lease.cold_start.env_s > 0     # its own stage
        assert answer == {"echo": "hi", "batch": 1, "pid": answer["pid"], "weights": "probe-weights-v1",
                          "instance": answer["instance"]}
        python, *args = command_line(host_pid(answer["pid"], handle.pid))   # in its sandbox's PID namespace
        assert python == "/srv/venv/bin/python" and args[:2] == ["-m", "runtime.functions.server"]
        venv = command_line(handle.pid)[-1].split(" /srv/venv ")[0].rsplit(" ", 1)[-1]   # bound there by bwrap
        assert Path(venv).parent.parent == cluster.node_cache(handle.node_id) / "function-envs"   # /<uid>/<venv>
        assert "CUDA_VISIBLE_DEVICES" in seen                          # the actor's GPU, as Ray gave it
        assert not seen & {"THAWPOOL_CACHE_DIR", "THAWPOOL_REPLICA_SECRET"}, seen   # the node's env, the secret
        assert not [name for name in seen if name.startswith("RAY_")], seen
        assert not (settings.cache_dir / "function-envs").exists()    # nothing built on the pool's machine
    assert await wait_until(lambda: process_gone(handle.pid), 30), command_line(handle.pid)
    assert await wait_until(lambda: gpus_free() == GPUS_PER_NODE * len(cluster.workers), 30), gpus_free()


async def test_the_next_pool_finds_a_function_replica_still_serving(cluster, tmp_path):
    settings = ray_settings(tmp_path, ray_namespace=f"tp-{uuid.uuid4().hex[:8]}")
    spec = function_spec("s3://unused/probe/")
    first, second = RayBackend(settings), RayBackend(settings)
    await first.start()
    slot = (await first.inventory())[0]
    handle = await start_on(first, spec, [slot], probe_package(tmp_path / "probe"), "fn-kept")
    try:
        assert await wait_ready(handle), handle.exit_reason()
        served = (await invoke(handle, {"echo": 1}))["pid"]
        first.forget(handle)                  # its pool goes away without stopping it, as in a crash
        await second.start()
        (survivor,) = await second.survivors()
        found = survivor.handle
        assert found is not None and survivor.record.fingerprint == spec_fingerprint(spec)
        assert (found.pid, found.base_url, found.headers) == (handle.pid, handle.base_url, handle.headers)
        async with httpx.AsyncClient(timeout=10) as http:
            assert await serves(found, http, spec.revision_id)
        assert host_pid((await invoke(found, {"echo": 2}))["pid"], found.pid) == host_pid(served, handle.pid)
        await second.close()                  # stops what it adopted
        assert await wait_until(lambda: process_gone(handle.pid), 30)
    finally:
        await handle.stop(5)
        await first.close()
        await second.close()
    assert await wait_until(lambda: gpus_free() == GPUS_PER_NODE * len(cluster.workers), 30), gpus_free()


async def test_a_venv_that_cannot_be_built_fails_the_start_with_the_installers_reason(backend, cluster, tmp_path):
    package = probe_package(tmp_path / "probe")
    manifest = package / "thawpool.toml"
    manifest.write_text(manifest.read_text().replace("requirements = []", 'requirements = ["tinydep==9.9"]'))
    (package / "wheels").mkdir()              # its own wheels only, and none of them is tinydep
    slot = (await backend.inventory())[0]
    with pytest.raises(ColdStartFailed) as failed:
        await start_on(backend, function_spec("s3://unused/probe/"), [slot], package, "fn-broken")
    assert "installing requirements failed" in failed.value.reason and "tinydep" in failed.value.reason
    assert backend.replicas == {}
    assert await wait_until(lambda: gpus_free() == GPUS_PER_NODE * len(cluster.workers), 30), gpus_free()
