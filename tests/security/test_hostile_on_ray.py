"""The hostile tenant on the Ray backend: its function and a model replica, each in a Ray
actor on a node of the session's loopback cluster, looked at as on the local backend
(test_hostile_function.py).

A Ray node runs the cluster's GCS and raylet next to the replicas: a handler that
reached them could list every actor (replica records and secrets included). Each
assertion fails on a pool with THAWPOOL_SANDBOX=off.
"""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from spec.engine_options import ChosenOptions

pytest.importorskip("ray", reason="ray not installed")

from pool.api import RevisionSpec  # noqa: E402
from pool.backends.ray import RayBackend  # noqa: E402
from tests.pool_ray.conftest import GPUS_PER_NODE, gpus_free, ray_settings, start_on, wait_until  # noqa: E402
from tests.pool_ray.test_backend import CPU_ENGINE, wait_ready  # noqa: E402

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="session"),
              pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox needs root (no root here)")]
HOSTILE = Path(__file__).resolve().parents[1] / "security" / "packages" / "hostile"


async def probe(handle, name: str, **args: Any) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=60, headers=handle.headers) as client:
        resp = await client.post(f"{handle.base_url}/invoke", json={"input": {"probe": name, "args": args}})
    assert resp.status_code == 200, resp.text
    return resp.json()["output"]


def spec_for(kind: str, uri: str = "s3://unused/x/") -> RevisionSpec:
    return RevisionSpec(f"rev-{uuid.uuid4().hex[:8]}", f"dep-{kind}", "ten-hostile", uri, gpu_memory_gb=0.25,
                        max_replicas=1, kind=kind, engine=CPU_ENGINE if kind == "model" else ChosenOptions())


@pytest.fixture
async def sandboxed(cluster, tmp_path):
    backend = RayBackend(ray_settings(tmp_path, ray_namespace=f"sb-{uuid.uuid4().hex[:8]}"))
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()
    assert await wait_until(lambda: gpus_free() == GPUS_PER_NODE * len(cluster.workers), 30), gpus_free()


async def test_a_hostile_function_on_ray_finds_nothing_of_the_node_or_the_cluster(sandboxed, cluster, tmp_path):
    slot = (await sandboxed.inventory())[0]
    handle = await start_on(sandboxed, spec_for("function"), [slot], shutil.copytree(HOSTILE, tmp_path / "h"),
                            "hostile-ray")
    try:
        assert await wait_ready(handle), handle.exit_reason()
        me = await probe(handle, "identity")
        assert me["uid"] != 0 and me["cap_eff"] == "0000000000000000" and me["seccomp"] == "2", me
        assert len((await probe(handle, "processes"))["pids"]) <= 3, "only its own PID namespace"
        host, port = cluster.cluster.address.rsplit(":", 1)
        sockets = [str(p) for p in cluster.root.rglob("*") if p.is_socket()]
        reached = await probe(handle, "connect", tcp=[[host, int(port)]], unix=sockets)
        assert reached["reached"] == [], "neither the GCS nor a raylet's socket"
        node_cache = cluster.node_cache(handle.node_id)
        found = await probe(handle, "files", paths=[str(cluster.root), str(node_cache / "state")])
        assert found["found"] == {}, "no Ray session folder, no node state"
    finally:
        await handle.stop(5)


async def test_a_model_replica_on_ray_runs_in_its_sandbox(sandboxed, tiny_model):
    slot = (await sandboxed.inventory())[0]
    handle = await start_on(sandboxed, spec_for("model"), [slot], tiny_model, "model-ray")
    try:
        assert await wait_ready(handle), handle.exit_reason()
        server = [pid for pid in _group(handle.pid) if b"python" in _argv(pid).split(b"\0")[0]
                  and b"runtime.serve.server" in _argv(pid)]
        assert server, "the runtime server runs in the replica's process group"
        uid = int(Path(f"/proc/{server[0]}/status").read_text().split("Uid:")[1].split()[0])
        assert uid != 0
        assert os.readlink(f"/proc/{server[0]}/ns/net") != os.readlink("/proc/self/ns/net"), "no network"
    finally:
        await handle.stop(5)


def _group(leader: int) -> list[int]:
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if os.getpgid(int(proc.name)) == leader:
                found.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return found


def _argv(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
