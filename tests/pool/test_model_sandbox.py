"""Model replicas in their sandbox (pool/model_sandbox.py), on real runtime.serve.server processes.

Two tenants' models on one pool: one replica thawed from a sandboxed warm standby,
one started directly. Each is looked at from the host, as an attacker inside it
would find itself: its uid, capabilities, seccomp, network namespace and the files
its root holds, its adapter inbox among them. Each assertion fails with the sandbox off
(THAWPOOL_SANDBOX=off: uid 0, the host's network and files, no inbox). The packed-layer
hand-over is tested on its own, with the files a hostile replica could leave behind.
"""
from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path

import pytest

from pool.api import RevisionSpec
from pool.backends.local import STANDBY_NICE
from pool.in_memory import InMemoryDesiredState
from pool.manager import PoolManager
from pool.model_sandbox import ModelSandboxes
from pool.sandbox import Platform, Sandbox, own_folder
from pool.settings import PoolSettings
from tests.pool.conftest import make_settings, running_manager
from tests.support.model_factory import upload_model
from tests.support.replica_client import replica_http
from tests.support.waiting import eventually
from spec.engine_options import ChosenOptions
from wire.replica_control import ADAPTER_INBOX_FLAG

pytestmark = [pytest.mark.timeout(240), pytest.mark.asyncio(loop_scope="session")]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox needs root (no root here)")


def spec_for(uri: str, tenant: str) -> RevisionSpec:
    return RevisionSpec(revision_id=f"rev-{uuid.uuid4().hex[:8]}", deployment_id=f"dep-{tenant}",
                        tenant_id=tenant, model_uri=uri, gpu_memory_gb=0.25, idle_timeout_s=600.0,
                        engine=ChosenOptions({"kv_cache_tokens": 512}))


@pytest.fixture(scope="module")
async def two_tenants(s3_server, pool_bucket, tiny_model, model_factory, tmp_path_factory):
    settings = make_settings(s3_server, tmp_path_factory.mktemp("sandboxed-pool"), cpu_slots=2,
                             slot_memory_gb=1, warm_pool_size=1, tick_s=0.2, runtime_threads=1,
                             kv_cache_tokens_default=512, load_timeout_s=120, pull_timeout_s=60)
    other = model_factory(arch="llama", hidden_size=32)
    uris = [upload_model(m, s3_server.client(), pool_bucket, f"{uuid.uuid4().hex[:8]}/m") for m in (tiny_model, other)]
    async with running_manager(settings) as (manager, desired):
        yield manager, desired, settings, uris


async def serving(manager: PoolManager, desired: InMemoryDesiredState, spec: RevisionSpec) -> dict:
    """The replica's server process as the host sees it, after it answered a completion."""
    desired.put(spec)
    async with await manager.acquire(spec, request_id=uuid.uuid4().hex, prefix_key=None, prompt_tokens=4,
                                     timeout_s=120) as lease:
        async with replica_http(timeout=60, headers=lease.headers) as client:
            answer = await client.post(f"{lease.base_url}/v1/completions",
                                       json={"model": spec.revision_id, "prompt": "hi", "max_tokens": 3})
        assert answer.status_code == 200, answer.text
        handle = manager.handle(lease.replica_id)
        group = handle.process.pid
        return {"pid": server_pid(group), "group": group, "inbox": handle.adapter_inbox}


def server_pid(group: int) -> int:
    """The host PID of the group's runtime.serve.server (the sandbox's own processes run it)."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if os.getpgid(int(proc.name)) != group:
                continue
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"runtime.serve.server" in argv and b"bwrap" not in argv[0] \
                and b"sh" != Path(argv[0].decode()).name.encode():
            return int(proc.name)
    raise LookupError(f"no runtime.serve.server in group {group}")


def nice_values(group: int) -> set[int]:
    """The nice of every thread of the group's processes, and of its autogroup where the
    kernel has them (then the threads' nice weighs only within it)."""
    values = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if os.getpgid(int(proc.name)) != group:
                continue
            for task in (proc / "task").iterdir():
                stat = (task / "stat").read_text()
                values.add(int(stat[stat.rfind(")") + 2:].split()[16]))
        except (OSError, ValueError):
            continue
    autogroup = Path(f"/proc/{group}/autogroup")
    if autogroup.exists():
        values.add(int(autogroup.read_text().split()[-1]))
    return values


def status_of(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, v in (line.split(":", 1) for line in lines if ":" in line)}


@needs_root
async def test_each_model_replica_is_a_uid_of_its_own_seeing_only_its_model(two_tenants):
    manager, desired, settings, (uri_a, uri_b) = two_tenants
    a = await serving(manager, desired, spec_for(uri_a, "tenant-a"))
    b = await serving(manager, desired, spec_for(uri_b, "tenant-b"))
    uids = []
    for replica in (a, b):
        status = status_of(replica["pid"])
        uid = int(status["Uid"].split()[0])
        assert uid != 0 and status["CapEff"] == "0000000000000000", status
        assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2", status
        assert os.readlink(f"/proc/{replica['pid']}/ns/net") != os.readlink("/proc/self/ns/net"), "no network"
        root = Path(f"/proc/{replica['pid']}/root")
        assert (root / "srv/model/config.json").is_file()
        assert not (root / Path(settings.cache_dir).relative_to("/")).exists(), "the node's cache is not there"
        uids.append(uid)
    assert uids[0] != uids[1]
    sizes = {r["pid"]: (Path(f"/proc/{r['pid']}/root") / "srv/model/model.safetensors").stat().st_size for r in (a, b)}
    assert sizes[a["pid"]] != sizes[b["pid"]], "each sees its own model, not the other's"
    each_inbox_is_its_own_and_read_only(a, b)


def each_inbox_is_its_own_and_read_only(a: dict, b: dict) -> None:
    """What the pool links into one replica's adapter inbox shows at /srv/adapters in that
    replica only, and no replica can write there (a read-only bind: not even root could)."""
    assert a["inbox"] is not None and b["inbox"] is not None and a["inbox"] != b["inbox"]
    for replica in (a, b):
        argv = Path(f"/proc/{replica['pid']}/cmdline").read_bytes().split(b"\0")
        assert argv[argv.index(ADAPTER_INBOX_FLAG.encode()) + 1] == b"/srv/adapters"
    delivered = a["inbox"] / "0123abcd-adapter_model.safetensors"
    delivered.write_bytes(b"tenant-a's adapter")
    try:
        inside = {r["pid"]: Path(f"/proc/{r['pid']}/root/srv/adapters") for r in (a, b)}
        assert [p.name for p in inside[a["pid"]].iterdir()] == [delivered.name]
        assert list(inside[b["pid"]].iterdir()) == [], "another replica's inbox is not there"
        for folder in inside.values():
            with pytest.raises(OSError) as refused:
                (folder / "planted").write_bytes(b"x")
            assert refused.value.errno == errno.EROFS
        info = a["inbox"].stat()
        assert (info.st_uid, info.st_mode & 0o777) == (0, 0o755), "root's on the host: only the pool puts files there"
    finally:
        delivered.unlink()


@needs_root
async def test_packed_layers_go_to_their_tenant_and_nothing_else_does(tmp_path):
    settings = PoolSettings(accelerator="cpu", cache_dir=tmp_path / "cache")
    models = ModelSandboxes(Sandbox(tmp_path / "state", Platform(())), settings)
    uid, name = 345_678, "model-r1"
    folder = models.folder(name)
    own_folder(models.run_folder(name), uid, 0o700)
    (folder / "packed").mkdir(parents=True)
    (folder / "tenant").write_text("tenant-a")
    secret = tmp_path / "admin-key"
    secret.write_text("the node's")
    planted = {
        "a" * 32 + ".pack": "its own",                    # kept
        "b" * 32 + ".pack": "a link to a host file",      # a second name of another file
        "c" * 32 + ".pack": None,                         # a symlink
        "d" * 32 + ".pack": "root's",                     # not written by the replica
        "not-a-pack.txt": "its own",                      # not a pack
    }
    for file, text in planted.items():
        path = folder / "packed" / file
        if text is None:
            path.symlink_to(secret)
        elif text == "a link to a host file":
            os.link(secret, path)
            os.chown(path, uid, uid)
        else:
            path.write_text(text)
            if text != "root's":
                os.chown(path, uid, uid)
    models.remove(name)
    kept = list(models._tenant_packs("tenant-a").iterdir())
    assert [p.name for p in kept] == ["a" * 32 + ".pack"]
    info = kept[0].stat()
    assert (info.st_uid, info.st_mode & 0o777) == (0, 0o444), "the tenant's, read-only, the replica's no more"
    assert not folder.exists() and list(models._tenant_packs("tenant-b").iterdir()) == []


@needs_root
async def test_a_standby_warms_up_in_the_background_and_serves_at_full_weight(two_tenants):
    manager, desired, _, (uri_a, _) = two_tenants
    await eventually(lambda: manager.backend.standbys_ready >= 1, timeout_s=120, what="a standby up")
    standby = manager.backend._warm[0].process.pid
    assert nice_values(standby) == {STANDBY_NICE}, "its start yields the CPU to replicas serving calls"
    served = await serving(manager, desired, spec_for(uri_a, "tenant-a"))
    assert served["group"] == standby, "the ready standby took the load"
    assert nice_values(standby) == {0}, "a replica a caller waits for runs at the normal weight"


@needs_root
async def test_a_start_that_fails_leaves_no_folder_behind(tmp_path):
    settings = PoolSettings(accelerator="cpu", cache_dir=tmp_path / "cache")
    models = ModelSandboxes(Sandbox(tmp_path / "state", Platform(())), settings)
    name = f"model-{uuid.uuid4().hex[:8]}"

    def args() -> list[str]:
        raise FileNotFoundError("the model's folder went away")

    with pytest.raises(FileNotFoundError):
        models.server(name, "python", {"THAWPOOL_REPLICA_SECRET": "s"}, None, [], args)
    assert not models.folder(name).exists() and not models.run_folder(name).exists()


async def test_a_kernel_build_cancelled_is_killed_with_its_compilers(tmp_path):
    """A pool closed during the node's kernel build (pool/backends/local.py cancels it) does
    not wait for it, and leaves neither the build nor a compiler it started running."""
    import asyncio

    settings = PoolSettings(accelerator="cpu", cache_dir=tmp_path / "cache")
    models = ModelSandboxes(Sandbox(tmp_path / "state", Platform(())), settings)
    pids = tmp_path / "pids"
    build = tmp_path / "python"          # stands for the interpreter: a build that takes long
    build.write_text(f"#!/bin/sh\nsleep 300 &\necho $$ $! > {pids}\nwait\n")
    build.chmod(0o755)
    task = asyncio.ensure_future(models.prebuild_kernels_async(str(build), dict(os.environ)))
    await eventually(lambda: pids.exists() and len(pids.read_text().split()) == 2, timeout_s=30,
                     what="the build and its child running")
    started = [int(pid) for pid in pids.read_text().split()]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: not any(_alive(pid) for pid in started), timeout_s=10, what="both gone")


def _alive(pid: int) -> bool:
    """Running, not a zombie awaiting its reaper (sleep's parent is the killed build)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
