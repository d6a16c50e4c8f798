"""Local backend: each replica is a `python -m runtime.serve.server` child on 127.0.0.1.

A warm pool keeps `warm_pool_size` standby processes (`--standby`: torch and
the engine imported, no model); a cold start takes one and POSTs
/admin/load, so it pays only for the weights. The pool is refilled in the
background a moment after that load is done, and a standby warms up at a low
CPU weight (STANDBY_NICE) until it is taken: on a node of few cores its start
would otherwise slow the cold start it stands by for. Without a warm process
(pool empty, size 0, or a multi-GPU replica that needs its own
CUDA_VISIBLE_DEVICES) the replica is started directly with `--model DIR`.

Each process gets its own secret when it is spawned (a standby too, which
then authenticates its /admin/load) and serves one replica in its life, so a
standby's secret becomes its replica's and is never shared with another
replica, of any tenant.

The slots are this machine's (CUDA devices, else declared CPU slots),
discovered once; the pool's own weight cache is the only one, so no node is
preferred for holding a model.

Every process is registered in the state dir (backends/local_state.py) from
its spawn to its stop, with its replica's record once it serves one. Its own
session keeps it alive when the control plane dies; the next pool's
`survivors()` finds it there: a replica is handed to the manager (adopted or
stopped there), a standby is stopped at once, a dead one is unregistered.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
import weakref
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import httpx

from pool.adoption import Registration, record_for
from pool.api import ColdStartFailed, RevisionSpec
from pool.backends.base import ReplicaHandle, Survivor
from pool import function_env
from pool.backends.local_state import ProcessEntry, ProcessRegistry
from pool.backends.runtime_args import (auth_headers, engine_flags, engine_for,
                                        new_secret, runtime_env)
from pool.egress import EgressProxy
from pool.health import wait_healthy
from pool.function_sandbox import FunctionSandboxes, gpu_indices
from pool.model_sandbox import MODEL, ModelSandboxes
from wire.replica_address import address_of, unix_base_url
from wire.replica_control import HEALTH_PATH, LOAD_ACCEPTED, LOAD_PATH, Health, HealthStatus, LoadRequest
from pool.inventory import Slot, discover_slots
from pool.processes import RuntimeProcess, free_port
from pool.replica_http import replica_client
from pool.settings import PoolSettings

log = logging.getLogger(__name__)

STANDBY_NICE = 10


@dataclass
class LocalReplica:
    replica_id: str
    base_url: str
    process: RuntimeProcess
    warm: bool                       # started from the warm pool (False: direct, or adopted)
    secret: str = field(repr=False)
    env_s: float = 0.0               # a function's venv is the pool's cold-start stage, not ours

    @property
    def headers(self) -> Mapping[str, str]:
        return auth_headers(self.secret)

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def exit_reason(self) -> Optional[str]:
        how = self.process.exit_description()
        if how is None:
            return None
        tail = self.process.log_tail(300).splitlines()[-1:] or [""]
        return f"runtime process {self.process.pid} {how}: {tail[0]}".rstrip(": ")

    async def stop(self, timeout_s: float) -> None:
        await self.process.stop(timeout_s)


@dataclass
class WarmProcess:
    process: RuntimeProcess
    base_url: str
    ready: asyncio.Future[bool]      # True once /health says standby
    secret: str = field(repr=False)
    sandbox: Optional[str] = None    # its sandbox's name (pool/model_sandbox.py); None: unconfined


class LocalBackend:
    pulls_on_node = False            # replicas read the pool's own cache folder
    can_sleep = True                 # a process's GPU memory is freed by its /sleep

    def __init__(self, settings: PoolSettings):
        self.settings = settings
        self.http = replica_client(httpx.Timeout(10.0, connect=2.0))
        self._slots: Optional[list[Slot]] = None
        self._warm: list[WarmProcess] = []
        self._all: dict[int, RuntimeProcess] = {}          # every process on our books, by PID
        self._replicas: dict[str, LocalReplica] = {}
        self._refilling: Optional[asyncio.Task[None]] = None
        self._closed = False
        self._state = ProcessRegistry(settings.replica_state_dir / "local")
        self.sandboxes = FunctionSandboxes.from_settings(settings)
        self.models = ModelSandboxes(self.sandboxes.sandbox, settings) if self.sandboxes else None
        self._sandbox_of: dict[str, str] = {}              # replica id -> its model sandbox's name
        self._egress: dict[str, EgressProxy] = {}          # replica id -> its granted hosts' proxy
        self._kernels: Optional[asyncio.Future[None]] = None
        self._left_behind: list[ProcessEntry] = []        # what an earlier pool registered
        # last resort if close() never ran (a crashed test, interpreter exit): SIGKILL by PID
        self._finalizer = weakref.finalize(self, _kill_all, self._all)

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        self._state.lock()
        self._left_behind = self._state.entries()
        if self.models is not None:
            env = {**os.environ, **runtime_env(None, "")}
            self._kernels = asyncio.ensure_future(
                asyncio.to_thread(self.models.prebuild_kernels, self.settings.runtime_python, env))
        self.refill()

    async def close(self) -> None:
        self._closed = True
        if self._refilling:
            self._refilling.cancel()
            await asyncio.gather(self._refilling, return_exceptions=True)
        await asyncio.gather(*(p.stop(self.settings.stop_timeout_s) for p in self._all.values()),
                             return_exceptions=True)
        for warm in self._warm:
            if not warm.ready.done():
                warm.ready.cancel()
        for pid in self._all:
            self._state.remove(pid)
        for replica_id in self._replicas:
            self._unsandbox(replica_id)
        for warm in self._warm:
            self._unsandbox_standby(warm)
        if self._kernels is not None:
            await asyncio.gather(self._kernels, return_exceptions=True)
        self._warm.clear()
        self._all.clear()
        self._replicas.clear()
        self._state.unlock()
        await self.http.aclose()

    def detach(self) -> None:
        """Let go of every process without stopping it, as a crash of the control plane
        would: they stay registered, for the next pool on this state dir to find."""
        self._closed = True
        if self._refilling:
            self._refilling.cancel()
        for proxy in self._egress.values():
            proxy.close()                          # threads of this process: a crash ends them
        self._finalizer.detach()
        self._state.unlock()

    # -- slots -------------------------------------------------------------

    async def inventory(self) -> list[Slot]:
        """This machine's slots, probed once (a CUDA probe starts a child process)."""
        if self._slots is None:
            self._slots = await asyncio.to_thread(discover_slots, self.settings)
        return list(self._slots)

    async def nodes_holding(self, keys: Iterable[str]) -> set[str]:
        return set()                 # one node, one cache: nothing to prefer

    # -- replicas ----------------------------------------------------------

    async def start_replica(self, spec: RevisionSpec, slots: Sequence[Slot], model_dir: Optional[Path],
                            replica_id: str, *, registration: Optional[Registration] = None) -> LocalReplica:
        if model_dir is None:
            raise ValueError("the local backend serves from the pool's own copy: model_dir is required")
        if spec.kind == "function":          # its own venv's interpreter: never a warm standby
            replica = self._start_function(spec, slots, model_dir, replica_id)
            self._replicas[replica_id] = replica
            self._register(replica, spec, slots, registration)
            return replica
        engine = engine_for(spec, slots, self.settings.kv_cache_tokens_default, isolated=False,
                            packed=(self.settings.packed_dir, self.settings.packed_cache_gb))
        # a sandboxed standby sees no GPU: a CUDA replica in a sandbox starts directly
        direct = needs_own_process(slots) or (self.models is not None and any(s.kind == "cuda" for s in slots))
        warm = None if direct else await self._take_warm()
        replica = self._start_direct(spec, slots, model_dir, engine, replica_id) if warm is None \
            else await self._thaw(warm, model_dir, spec, engine, replica_id)
        self._replicas[replica_id] = replica
        self._register(replica, spec, slots, registration)
        return replica

    def _register(self, replica: LocalReplica, spec: RevisionSpec, slots: Sequence[Slot],
                  registration: Optional[Registration]) -> None:
        """The process's entry, now with the record of the replica it serves."""
        record = record_for(spec, slots[0].node if slots else self.settings.node, [s.slot_id for s in slots],
                            replica.replica_id, base_url=replica.base_url, secret=replica.secret,
                            registration=registration, started_at=datetime.now(timezone.utc))
        process = replica.process
        port = address_of(replica.base_url).port            # 0: a unix socket
        egress = spec.quota.egress if replica.replica_id in self._egress else ()
        self._state.write(ProcessEntry(process.pid, process.started, port, process.log_path, record, egress))

    async def _thaw(self, warm: WarmProcess, model_dir: Path, spec: RevisionSpec,
                    engine: dict[str, Any], replica_id: str) -> LocalReplica:
        """The standby loads the model; the pool refills once that load is done."""
        try:
            replica = await self._load_into(warm, model_dir, spec, engine, replica_id)
        except BaseException:
            self.refill()
            raise
        self.refill(after=replica)
        return replica

    async def _load_into(self, warm: WarmProcess, model_dir: Path, spec: RevisionSpec,
                         engine: dict[str, Any], replica_id: str) -> LocalReplica:
        base_url, model = warm.base_url, str(model_dir)
        if warm.sandbox is not None:
            assert self.models is not None
            engine = self.models.place(warm.sandbox, model_dir, spec.tenant_id, self._memory_mb(spec, []), engine)
            self._sandbox_of[replica_id], model = warm.sandbox, str(MODEL)
        body = LoadRequest(model, spec.revision_id, engine).to_json()
        try:
            resp = await self.http.post(f"{base_url}{LOAD_PATH}", json=body, headers=auth_headers(warm.secret))
        except httpx.HTTPError as exc:
            await self._discard_standby(warm)
            raise RuntimeError(f"warm runtime did not take the load command: {exc!r}") from exc
        if resp.status_code != LOAD_ACCEPTED:
            await self._discard_standby(warm)
            raise RuntimeError(f"warm runtime refused the load command: {resp.status_code} {resp.text[:300]}")
        return LocalReplica(replica_id, base_url, warm.process, warm=True, secret=warm.secret)

    def _start_direct(self, spec: RevisionSpec, slots: Sequence[Slot], model_dir: Path,
                      engine: dict[str, Any], replica_id: str) -> LocalReplica:
        if self.models is not None:
            return self._start_model_sandboxed(spec, slots, model_dir, engine, replica_id)
        port, secret = free_port(self.settings.host), new_secret()
        args = [*self._server_args(port), "--model", str(model_dir),
                "--served-model-name", spec.revision_id, *engine_flags(engine)]
        proc = self._spawn(args, f"replica-{replica_id}", slots, secret, port)
        return LocalReplica(replica_id, f"http://{self.settings.host}:{port}", proc, warm=False, secret=secret)

    def _start_model_sandboxed(self, spec: RevisionSpec, slots: Sequence[Slot], model_dir: Path,
                               engine: dict[str, Any], replica_id: str) -> LocalReplica:
        """runtime.serve.server with its model in a sandbox of its own (pool/model_sandbox.py)."""
        models = self.models
        assert models is not None
        name, secret, memory = f"model-{replica_id}", new_secret(), self._memory_mb(spec, slots)
        proc, base_url = self._spawn_model_sandbox(name, secret, memory, slots, lambda: [
            "--model", str(MODEL), "--served-model-name", spec.revision_id,
            *engine_flags(models.place(name, model_dir, spec.tenant_id, None, engine))])
        self._sandbox_of[replica_id] = name
        return LocalReplica(replica_id, base_url, proc, warm=False, secret=secret)

    def _spawn_model_sandbox(self, name: str, secret: str, memory_mb: Optional[int], slots: Sequence[Slot],
                             args: Callable[[], list[str]]) -> tuple[RuntimeProcess, str]:
        """runtime.serve.server in the sandbox `name` (ModelSandboxes.server)."""
        assert self.models is not None
        gpus = gpu_indices(slots)
        env = runtime_env(self.settings.runtime_threads, secret)
        if len(gpus) > 1:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpus)
        server = self.models.server(name, self.settings.runtime_python, env, memory_mb, gpus, args)
        proc = self._spawn(server.command, name, slots, secret, 0, server.env)
        return proc, unix_base_url(str(server.socket))

    def _memory_mb(self, spec: RevisionSpec, slots: Sequence[Slot]) -> Optional[int]:
        on_cuda = any(s.kind == "cuda" for s in slots)
        return function_env.memory_limit_mb(spec.gpu_memory_gb, len(slots), on_cuda=on_cuda)

    def _start_function(self, spec: RevisionSpec, slots: Sequence[Slot], package_dir: Path,
                        replica_id: str) -> LocalReplica:
        """runtime.functions.server in the venv cold_start built, with a clean environment,
        in its sandbox (pool/function_sandbox.py) unless the operator turned that off."""
        secret = new_secret()
        cuda = [s.device_index for s in slots if s.kind == "cuda" and s.device_index is not None]
        limit = function_env.memory_limit_mb(spec.gpu_memory_gb, len(slots), on_cuda=bool(cuda))
        python = str(spec.engine[function_env.FUNCTION_PYTHON])
        if self.sandboxes is not None:
            return self._start_sandboxed(spec, slots, package_dir, replica_id, python, limit, secret, cuda)
        port = free_port(self.settings.host)
        args = function_env.server_args(python, self.settings.host, port, package_dir, spec.revision_id, limit)
        env = function_env.server_env(os.environ, runtime_env(self.settings.runtime_threads, secret), cuda)
        proc = self._spawn(args, f"function-{replica_id}", slots, secret, port, env)
        return LocalReplica(replica_id, f"http://{self.settings.host}:{port}", proc, warm=False, secret=secret)

    def _start_sandboxed(self, spec: RevisionSpec, slots: Sequence[Slot], package_dir: Path, replica_id: str,
                         python: str, limit: Optional[int], secret: str, cuda: list[int]) -> LocalReplica:
        """The same server as the tenant's uid, on a unix socket, its secret in a file."""
        assert self.sandboxes is not None
        env = function_env.server_env({}, runtime_env(self.settings.runtime_threads, secret), cuda)
        server = self.sandboxes.server(spec.tenant_id, replica_id, package_dir, python, spec.revision_id, limit,
                                       env, cuda, spec.quota.egress)
        if server.egress is not None:
            self._egress[replica_id] = server.egress
        proc = self._spawn(server.command, f"function-{replica_id}", slots, secret, 0, server.env)
        return LocalReplica(replica_id, unix_base_url(str(server.socket)), proc, warm=False, secret=secret)

    async def _discard(self, proc: RuntimeProcess) -> None:
        await proc.stop(self.settings.stop_timeout_s)
        self._all.pop(proc.pid, None)
        self._state.remove(proc.pid)

    async def _discard_standby(self, warm: WarmProcess) -> None:
        await self._discard(warm.process)
        self._unsandbox_standby(warm)

    def forget(self, handle: ReplicaHandle) -> None:
        replica = self._replicas.pop(handle.replica_id, None)
        if replica is not None:
            self._all.pop(replica.process.pid, None)
            self._state.remove(replica.process.pid)
        self._unsandbox(handle.replica_id)

    def _unsandbox(self, replica_id: str) -> None:
        """A stopped replica's sandbox folder and cgroups."""
        proxy = self._egress.pop(replica_id, None)
        if proxy is not None:
            proxy.close()
        model = self._sandbox_of.pop(replica_id, None)
        if model is not None and self.models is not None:
            self.models.remove(model)
        elif self.sandboxes is not None:
            self.sandboxes.remove(replica_id)

    def _unsandbox_standby(self, warm: WarmProcess) -> None:
        if warm.sandbox is not None and self.models is not None:
            self.models.remove(warm.sandbox)

    # -- what an earlier pool left -----------------------------------------

    async def survivors(self) -> list[Survivor]:
        found, self._left_behind = self._left_behind, []
        survivors = []
        for entry in found:
            process = RuntimeProcess(entry.pid, entry.started, entry.log_path)
            if entry.replica is None or not process.is_alive():
                await self._discard(process)          # a standby serves nobody: stopped; a dead one: unregistered
                if entry.replica is not None:
                    self._adopt_sandbox(entry.replica)
                    self._unsandbox(entry.replica.replica_id)
                    survivors.append(Survivor(entry.replica, None))
                continue
            replica = LocalReplica(entry.replica.replica_id, entry.replica.base_url, process, warm=False,
                                   secret=entry.replica.secret)
            self._adopt_sandbox(replica)
            self._adopt_egress(replica.replica_id, entry.egress)
            self._all[process.pid] = process
            self._replicas[replica.replica_id] = replica
            survivors.append(Survivor(entry.replica, replica))
        self._sweep_sandboxes()
        return survivors

    def _sweep_sandboxes(self) -> None:
        """Model sandboxes no process of ours holds any more (an earlier pool's standbys)."""
        if self.models is None or not self.models.root.is_dir():
            return
        held = {*self._sandbox_of.values(), *(w.sandbox for w in self._warm)}
        for folder in self.models.root.iterdir():
            if folder.name not in held:
                self.models.remove(folder.name)

    def _adopt_egress(self, replica_id: str, hosts: tuple[str, ...]) -> None:
        """The proxy of a function replica's granted hosts, which died with the earlier pool."""
        if hosts and self.sandboxes is not None:
            proxy = self.sandboxes.egress_proxy(replica_id, hosts)
            if proxy is not None:
                self._egress[replica_id] = proxy

    def _adopt_sandbox(self, replica: Any) -> None:
        """An earlier pool's model sandbox, by the name of its socket's folder (RUN_ROOT/<name>)."""
        socket = address_of(replica.base_url).socket
        if socket and self.models is not None and (self.models.root / Path(socket).parent.name).is_dir():
            self._sandbox_of[replica.replica_id] = Path(socket).parent.name

    # -- warm pool ---------------------------------------------------------

    @property
    def standbys_ready(self) -> int:
        """Warm standbys up and waiting for a load (a benchmark waits for the refill)."""
        return sum(1 for w in self._warm if w.ready.done() and not _failed(w.ready) and w.process.is_alive())

    async def _take_warm(self) -> Optional[WarmProcess]:
        """A standby process: a ready one if any, else one still starting, else None."""
        self._warm = [w for w in self._warm if w.process.is_alive() and not _failed(w.ready)]
        if not self._warm:
            return None
        ready = [w for w in self._warm if w.ready.done()]
        warm = (ready or self._warm)[0]
        self._warm.remove(warm)
        warm.process.set_nice(0)               # now a replica a caller waits for
        try:
            await asyncio.wait_for(asyncio.shield(warm.ready), self.settings.load_timeout_s)
            return warm
        except asyncio.CancelledError:
            await self._discard_standby(warm)
            raise
        except Exception:  # noqa: BLE001 - a standby that never came up: start directly
            await self._discard_standby(warm)
            return None

    def refill(self, after: Optional[LocalReplica] = None) -> None:
        """Standbys up to `warm_pool_size`, started `standby_refill_delay_s` after `after`
        (a replica a caller waits for) has loaded: its load and first call go first."""
        if self._closed or (self._refilling and not self._refilling.done()):
            return
        self._refilling = asyncio.ensure_future(self._refill(after))

    async def _refill(self, after: Optional[LocalReplica]) -> None:
        if after is not None:
            with contextlib.suppress(ColdStartFailed, asyncio.TimeoutError):
                await asyncio.wait_for(wait_healthy(after, self.http, self.settings.health_poll_s),
                                       self.settings.load_timeout_s)
            await asyncio.sleep(self.settings.standby_refill_delay_s)
        self._warm = [w for w in self._warm if w.process.is_alive() and not _failed(w.ready)]
        while not self._closed and len(self._warm) < self.settings.warm_pool_size:
            try:
                warm = self._spawn_standby()
            except ColdStartFailed as exc:          # no sandbox here: cold starts say why
                log.warning("no standby: %s", exc)
                return
            self._warm.append(warm)
            if not await self._watch_standby(warm):
                return                       # broken runtime: retry at the next refill

    def _spawn_standby(self) -> WarmProcess:
        """A standby at STANDBY_NICE until it is taken: its start (an interpreter and torch
        importing, ~2 CPU-seconds) yields to the cold start that triggered the refill."""
        warm = self._spawn_warm()
        warm.process.set_nice(STANDBY_NICE)
        return warm

    def _spawn_warm(self) -> WarmProcess:
        secret, ready = new_secret(), asyncio.get_running_loop().create_future()
        if self.models is not None:
            name = f"standby-{uuid.uuid4().hex[:12]}"
            proc, base_url = self._spawn_model_sandbox(name, secret, None, [], lambda: ["--standby"])
            return WarmProcess(proc, base_url, ready, secret, sandbox=name)
        port = free_port(self.settings.host)
        proc = self._spawn([*self._server_args(port), "--standby"], f"standby-{port}", [], secret, port)
        return WarmProcess(proc, f"http://{self.settings.host}:{port}", ready, secret)

    async def _watch_standby(self, warm: WarmProcess) -> bool:
        url = f"{warm.base_url}{HEALTH_PATH}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.load_timeout_s
        while loop.time() < deadline and warm.process.is_alive():
            try:
                resp = await self.http.get(url, timeout=2.0, headers=auth_headers(warm.secret))
                if Health.parse(resp.json()).status is HealthStatus.STANDBY:
                    if not warm.ready.done():
                        warm.ready.set_result(True)
                    return True
            except (httpx.HTTPError, ValueError):
                pass
            await asyncio.sleep(self.settings.health_poll_s * 2)
        if not warm.ready.done():
            warm.ready.set_exception(RuntimeError(f"standby runtime did not come up: {warm.process.log_tail()}"))
        await self._discard_standby(warm)
        return False

    # -- processes ---------------------------------------------------------

    def _server_args(self, port: int) -> list[str]:
        return [self.settings.runtime_python, "-m", "runtime.serve.server",
                "--host", self.settings.host, "--port", str(port)]

    def _spawn(self, args: list[str], name: str, slots: Sequence[Slot], secret: str, port: int,
               env: Optional[dict[str, str]] = None) -> RuntimeProcess:
        env = env if env is not None else self._env(slots, secret)
        proc = RuntimeProcess.spawn(args, env, self.settings.logs / f"{name}.log")
        self._all[proc.pid] = proc
        self._state.write(ProcessEntry(proc.pid, proc.started, port, proc.log_path))
        log.info("started %s pid %d", name, proc.pid)
        return proc

    def _env(self, slots: Sequence[Slot], secret: str) -> dict[str, str]:
        env = {**os.environ, **runtime_env(self.settings.runtime_threads, secret)}
        cuda = [s for s in slots if s.kind == "cuda"]
        if len(cuda) > 1:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(s.device_index) for s in cuda)
        return env


def _kill_all(processes: dict[int, RuntimeProcess]) -> None:
    for proc in list(processes.values()):
        proc.kill_now()


def needs_own_process(slots: Sequence[Slot]) -> bool:
    return sum(1 for s in slots if s.kind == "cuda") > 1


def _failed(fut: asyncio.Future[Any]) -> bool:
    return fut.done() and (fut.cancelled() or fut.exception() is not None)
