"""What runs on a Ray node for the Ray backend: one replica actor, one cache probe.

`ReplicaActor` is a plain class; backends/ray.py turns it into a Ray actor
that holds the replica's GPUs (Ray sets CUDA_VISIBLE_DEVICES for it) and
starts the replica's process as its child on the same node (`launch`): the
cold start's `ReplicaLaunch` (pool/launch.py) with this node's folder and
interpreter (its own, or for a function the package's venv, which the actor
builds first: `function_env`, under the node's own cache folder), on a port
of this node or in its sandbox (pool/replica_sandbox.py). The child
gets PR_SET_PDEATHSIG, so when the actor dies (ray.kill, node lost) the
runtime process dies with it and never holds a GPU Ray thinks is free. The
actor keeps its replica's record (`remember`), which the next pool reads
(`describe`) when it finds the actor after a control-plane crash.

Nothing here imports ray: the module is importable and testable anywhere.
"""
from __future__ import annotations

import asyncio
import ctypes
import fcntl
import os
import signal
import subprocess
import sys
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

from pool import function_env
from pool.api import Pins, ReplicaKind
from pool.egress import EgressProxy
from wire.socket_forward import SocketForward
from pool.function_sandbox import FunctionSandboxes
from pool.launch import ReplicaLaunch
from pool.replica_sandbox import ReplicaSandboxes
from pool.weights.inspection import FUNCTION_MANIFEST
from pool.processes import free_port
from pool.settings import PoolSettings

PR_SET_PDEATHSIG = 1
NODE_CACHE_ENV = "THAWPOOL_CACHE_DIR"      # a node's own cache folder, set where its raylet starts
NODE_BUDGET_ENV = "THAWPOOL_CACHE_DISK_BUDGET_GB"   # and its own disk budget for that cache
FOLDER_MARKERS = ("config.json", FUNCTION_MANIFEST)  # a model folder, or a function package


def _indices(gpus: Sequence[str]) -> list[int]:
    return [int(g) for g in gpus if g.isdigit()]


def visible_gpus(environ: Mapping[str, str]) -> list[str]:
    """The GPUs Ray gave the actor (CUDA_VISIBLE_DEVICES)."""
    return [d for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]


def node_sandboxes(settings: PoolSettings, launch: ReplicaLaunch) -> ReplicaSandboxes:
    """This node's sandboxes for a confined launch, with the kernels a model's sandbox binds
    built once per node (a sandbox's /tmp is its own)."""
    sandboxes = ReplicaSandboxes.from_settings(node_settings(settings))
    if sandboxes is None:
        raise RuntimeError("a sandboxed launch where the sandbox is off")
    if launch.kind == "model" and not sandboxes.models.kernels_dir.is_dir():
        path = launch.env.get("PYTHONPATH", "")
        sandboxes.models.prebuild_kernels(sys.executable, {**os.environ, "PYTHONPATH": path})
    return sandboxes


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL when the thread that started it goes away."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def node_cache_dir(default: Path) -> Path:
    """The weight cache of this node: its own THAWPOOL_CACHE_DIR, else the pool's path."""
    return Path(os.environ.get(NODE_CACHE_ENV) or default)


def node_settings(settings: PoolSettings) -> PoolSettings:
    """The pool's settings with this node's own cache folder and budget: the pool's
    machine has other disks than the GPU nodes."""
    changes: dict[str, Any] = {"cache_dir": node_cache_dir(settings.cache_dir)}
    if os.environ.get(NODE_BUDGET_ENV):
        changes["cache_disk_budget_gb"] = float(os.environ[NODE_BUDGET_ENV])
    return settings.with_(**changes)


def cache_entries(cache_dir: Path) -> list[str]:
    """Keys of the complete entries in a pool/weights/cache.py cache (objects/<key>/{data,meta.json})."""
    objects = Path(cache_dir) / "objects"
    if not objects.is_dir():
        return []
    return sorted(e.name for e in objects.iterdir()
                  if (e / "data").is_file() and (e / "meta.json").is_file())


class ReplicaActor:
    """One runtime child on this node; methods are called from the pool's process."""

    def __init__(self, replica_id: str, log_dir: str):
        self.replica_id = replica_id
        self.log_path = Path(log_dir) / f"replica-{replica_id}.log"
        self.process: Optional[subprocess.Popen[bytes]] = None
        self.installer: Optional[subprocess.Popen[bytes]] = None   # a function's venv build
        self.where: dict[str, Any] = {}          # what launch() answered
        self.record: Optional[dict[str, Any]] = None   # pool.adoption.ReplicaRecord.to_json()
        self.sandboxed: Optional[tuple[ReplicaSandboxes, ReplicaKind]] = None   # what stop() removes
        self.forward: Optional[SocketForward] = None    # the node's port to a sandboxed child's socket
        self.egress: Optional[EgressProxy] = None       # the proxy of its tenant's granted hosts

    # -- where am I --------------------------------------------------------

    def node(self) -> dict[str, Any]:
        import ray   # only ever called inside a Ray worker

        context = ray.get_runtime_context()
        ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        return {"node_id": context.get_node_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "ip": ip, "pid": os.getpid()}

    # -- weights -----------------------------------------------------------

    def model_folder(self, model_dir: Optional[str], model_uri: str, settings: PoolSettings,
                     pins: Pins) -> str:
        """model_dir when given and readable on this node, else the model (or function
        package) pulled into this node's cache (settings carry the S3 endpoint and
        credentials, if any), held to the objects its revision pinned."""
        if model_dir and any((Path(model_dir) / marker).is_file() for marker in FOLDER_MARKERS):
            return model_dir
        return asyncio.run(pull_model(model_uri, node_settings(settings), pins))

    def cached(self, default_cache_dir: str) -> list[str]:
        return cache_entries(node_cache_dir(Path(default_cache_dir)))

    # -- a function's venv -------------------------------------------------

    def function_env(self, package_dir: str, settings: PoolSettings,
                     tenant_id: str) -> tuple[Optional[int], bytes, bytes]:
        """Build (or find) the package's venv under this node's cache with this node's
        interpreter, in the tenant's sandbox as on the local backend (unless the operator
        turned it off), in a child of its own session: pip may run a dependency's build
        code, never in the actor. Answers the installer's exit code and output, which the
        pool reads (pool.function_env.built_env); stop() ends a build still running."""
        node = node_settings(settings)
        build = function_env.Build.of(node, sys.executable, Path(package_dir), FunctionSandboxes.from_settings(node),
                                      tenant_id, f"build-{self.replica_id}")
        try:
            self.installer = subprocess.Popen(
                build.command, env=build.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent)
            out, err = self.installer.communicate()
        finally:
            build.close()
        return self.installer.returncode, out, err

    # -- the runtime process -----------------------------------------------

    def launch(self, launch: ReplicaLaunch, secret: str, settings: PoolSettings, bind_host: str,
               advertise_host: Optional[str]) -> dict[str, Any]:
        """Start the launch's process on a port of this node (`--host --port`), or in its
        sandbox on its unix socket, which a SocketForward carries the port to; returns the
        base_url and where it runs. The launch's folder is this node's; its interpreter,
        where None, this node's own (the pool's path may not exist here). It sees the
        actor's GPUs, as Ray gave them."""
        interpreter, folder, gpus = launch.interpreter or sys.executable, launch.folder, visible_gpus(os.environ)
        if folder is None:
            raise ValueError("a launch on a node names the node's folder")
        if launch.sandbox is None:
            port = free_port(bind_host)
            process = self._spawn(launch.command(interpreter, str(folder), bind_host, port),
                                  launch.environment(os.environ, secret, gpus))
        else:
            sandboxes = node_sandboxes(settings, launch)
            server = sandboxes.server(launch, self.replica_id, interpreter, folder, secret, gpus, _indices(gpus))
            self.sandboxed, self.egress = (sandboxes, launch.kind), server.egress
            process = self._spawn(server.command, server.env)
            self.forward = SocketForward(bind_host, server.socket)
            port = self.forward.start()
        where = self.node()
        host = advertise_host or (where["ip"] if bind_host == "0.0.0.0" else bind_host)
        self.where = {**where, "base_url": f"http://{host}:{port}", "child_pid": process.pid}
        return self.where

    def _spawn(self, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=die_with_parent)
        return self.process

    def remember(self, record: dict[str, Any]) -> None:
        self.record = record

    def describe(self) -> dict[str, Any]:
        """What the next pool needs to adopt this replica: its record, where it runs, whether
        its runtime process still does, and the placement group it holds (hex id or None)."""
        import ray   # only ever called inside a Ray worker

        group = ray.get_runtime_context().get_placement_group_id()
        return {**self.where, "record": self.record, "returncode": self.returncode(), "placement_group": group}

    def wait_exit(self, timeout_s: Optional[float] = None) -> Optional[int]:
        """Blocks (in one of the actor's threads) until the runtime process exits; None if
        it still runs after timeout_s (callers ask again: a thread is never held for good
        by a caller that has gone away)."""
        if self.process is None:
            raise RuntimeError("the actor has no runtime process")
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def returncode(self) -> Optional[int]:
        return None if self.process is None else self.process.poll()

    def log_tail(self, limit: int = 600) -> str:
        try:
            return self.log_path.read_bytes()[-limit:].decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def stop(self, timeout_s: float) -> Optional[int]:
        """Stop the installer (if still building) and the runtime process."""
        for child in (self.installer, self.process):
            if child is not None:
                stop_group(child, timeout_s)
        for server in (self.forward, self.egress):
            if server is not None:
                server.close()
        if self.sandboxed is not None and self.returncode() is not None:
            sandboxes, kind = self.sandboxed
            sandboxes.remove(kind, self.replica_id)
        return self.returncode()


def stop_group(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM to the child's process group, SIGKILL after timeout_s."""
    if process.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        if wait_quietly(process, timeout_s):
            break


def wait_quietly(process: subprocess.Popen[bytes], timeout_s: float) -> bool:
    try:
        process.wait(timeout=timeout_s)
        return True
    except subprocess.TimeoutExpired:
        return False


async def pull_model(model_uri: str, settings: PoolSettings, pins: Pins) -> str:
    """Fetch a model into this node's cache with the same WeightStore the pool uses locally.

    One pull at a time per node cache: each replica's actor is its own process,
    and a WeightCache clears tmp/ when it opens, which would delete the part
    files of a pull still running for another replica on the same node. The
    second pull of a model then finds it cached.
    """
    from pool.s3 import open_client
    from pool.weights.cache import WeightCache
    from pool.weights.store import WeightStore

    with cache_lock(Path(settings.cache_dir)):
        async with AsyncExitStack() as stack:
            client = await open_client(settings, stack)
            store = WeightStore(client, WeightCache(settings.cache_dir, settings.cache_budget_bytes), settings)
            files = await store.fetch_model(model_uri, pins=pins)
            return str(files.model_dir)


@contextmanager
def cache_lock(cache_dir: Path) -> Iterator[None]:
    """An exclusive lock on a node's cache folder, held across processes (flock)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / ".pull.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)       # blocks this actor thread only
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

