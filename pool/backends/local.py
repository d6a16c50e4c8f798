"""Local backend: each replica is a child process on this machine, the cold start's
`ReplicaLaunch` (pool/launch.py) on a port of 127.0.0.1 or in its sandbox.

A warm pool keeps `warm_pool_size` standby processes (`--standby`: torch and
the engine imported, no model); a cold start of a model takes one and POSTs
/admin/load, so it pays only for the weights. The pool is refilled in the
background a moment after that load is done, and a standby warms up at a low
CPU weight (STANDBY_NICE) until it is taken: on a node of few cores its start
would otherwise slow the cold start it stands by for. A standby up and waiting is told
the model folders it will likely load (pool/likely_models.py: the revisions predicted
soon, then the models loaded here last), when it comes up, after each refill and as
the predictions change, and parses their tokenizers meanwhile. A sandboxed standby is
not told: it sees no model before its load, and a tokenizer it parsed ahead would be one
tenant's input in a process that may go on to serve another. Without a warm process
(pool empty, size 0, a multi-GPU replica that needs its own
CUDA_VISIBLE_DEVICES, a function in its own venv) the launch is started directly.

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
from typing import Any, Iterable, Mapping, Optional, Sequence

import httpx

from pool.adoption import Registration, record_for
from pool.api import ColdStartFailed, RevisionSpec
from pool.backends.base import ReplicaHandle, Survivor
from pool.backends.local_state import ProcessEntry, ProcessRegistry
from pool.backends.runtime_args import auth_headers, new_secret, runtime_env
from pool.egress import EgressProxy
from pool.health import wait_healthy
from pool.function_sandbox import gpu_indices
from pool.launch import MODEL_SERVER, ModelServer, ReplicaLaunch
from pool.model_sandbox import MODEL
from pool.replica_sandbox import ReplicaSandboxes, model_sandbox_name
from wire.replica_address import address_of, unix_base_url
from wire.replica_control import (HEALTH_PATH, LIKELY_PATH, LOAD_ACCEPTED, LOAD_PATH, Health, HealthStatus,
                                  LikelyModels, LoadRequest)
from pool.likely_models import ModelLoad, likely_models, remember
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
    adapter_inbox: Optional[Path] = None   # a sandboxed model's (pool/model_sandbox.py)

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
    told: tuple[str, ...] = ()       # the likely model folders it was told last


class LocalBackend:
    pulls_on_node = False            # replicas read the pool's own cache folder
    isolates_gpus = False            # a standby, started before its GPU is known, sees them all
    can_sleep = True                 # a process's GPU memory is freed by its /sleep

    def __init__(self, settings: PoolSettings):
        self.settings = settings
        self.http = replica_client(httpx.Timeout(10.0, connect=2.0))
        self._slots: Optional[list[Slot]] = None
        self._warm: list[WarmProcess] = []
        self._all: dict[int, RuntimeProcess] = {}          # every process on our books, by PID
        self._replicas: dict[str, LocalReplica] = {}
        self._refilling: Optional[asyncio.Task[None]] = None
        self._telling: Optional[asyncio.Task[None]] = None
        self._loads: tuple[ModelLoad, ...] = ()           # the models loaded here, newest first
        self._expected: tuple[str, ...] = ()               # revisions predicted soon (expect)
        self._closed = False
        self._state = ProcessRegistry(settings.replica_state_dir / "local")
        self.sandboxes = ReplicaSandboxes.from_settings(settings)
        self.models = self.sandboxes.models if self.sandboxes else None
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
            env = {**os.environ, **runtime_env(None)}
            self._kernels = asyncio.ensure_future(self.models.prebuild_kernels_async(self.settings.runtime_python, env))
        self.refill()

    async def close(self) -> None:
        self._closed = True
        for task in (self._refilling, self._telling):
            if task:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
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
            self._kernels.cancel()               # a build still under way is not waited for
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
        for task in (self._refilling, self._telling):
            if task:
                task.cancel()
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

    async def start_replica(self, spec: RevisionSpec, launch: ReplicaLaunch, slots: Sequence[Slot],
                            replica_id: str, *, registration: Optional[Registration] = None) -> LocalReplica:
        folder, interpreter = launch.folder, launch.interpreter
        if folder is None or interpreter is None:
            raise ValueError("the local backend starts what the pool pulled and built: "
                             "the launch's folder and interpreter are required")
        warm = await self._take_warm() if self._standby_may_load(launch, slots) else None
        replica = self._start_direct(launch, slots, replica_id, interpreter, folder) if warm is None \
            else await self._thaw(warm, launch, replica_id, folder)
        self._replicas[replica_id] = replica
        self._register(replica, spec, slots, registration)
        if launch.takes_standby:                 # a model, which standbys may load again
            self._loads = remember(self._loads, ModelLoad(spec.revision_id, str(folder)))
        return replica

    def _standby_may_load(self, launch: ReplicaLaunch, slots: Sequence[Slot]) -> bool:
        """A standby (confined as the launch asks, or not) sees every GPU of the machine, or
        none in a sandbox: a multi-GPU replica needs CUDA_VISIBLE_DEVICES of its own, a CUDA
        replica in a sandbox its GPUs' device files, so both start directly."""
        sandboxed = launch.sandbox is not None
        if not launch.takes_standby or sandboxed != (self.models is not None) or needs_own_process(slots):
            return False
        return not (sandboxed and any(s.kind == "cuda" for s in slots))

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

    async def _thaw(self, warm: WarmProcess, launch: ReplicaLaunch, replica_id: str, folder: Path) -> LocalReplica:
        """The standby loads the model; the pool refills once that load is done."""
        try:
            replica = await self._load_into(warm, launch, replica_id, folder)
        except BaseException:
            self.refill()
            raise
        self.refill(after=replica)
        return replica

    async def _load_into(self, warm: WarmProcess, launch: ReplicaLaunch, replica_id: str,
                         folder: Path) -> LocalReplica:
        program, confinement = launch.program, launch.sandbox
        assert isinstance(program, ModelServer), "only a model's launch takes a standby"
        base_url, model, engine = warm.base_url, str(folder), program.engine
        inbox: Optional[Path] = None
        if warm.sandbox is not None and confinement is not None:
            assert self.models is not None
            engine = self.models.place(warm.sandbox, folder, confinement.tenant_id, confinement.memory_mb, engine)
            self._sandbox_of[replica_id], model = warm.sandbox, str(MODEL)
            inbox = self.models.inbox(warm.sandbox)
        body = LoadRequest(model, program.served_name, engine.to_json()).to_json()
        try:
            resp = await self.http.post(f"{base_url}{LOAD_PATH}", json=body, headers=auth_headers(warm.secret))
        except httpx.HTTPError as exc:
            await self._discard_standby(warm)
            raise RuntimeError(f"warm runtime did not take the load command: {exc!r}") from exc
        if resp.status_code != LOAD_ACCEPTED:
            await self._discard_standby(warm)
            raise RuntimeError(f"warm runtime refused the load command: {resp.status_code} {resp.text[:300]}")
        return LocalReplica(replica_id, base_url, warm.process, warm=True, secret=warm.secret, adapter_inbox=inbox)

    def _start_direct(self, launch: ReplicaLaunch, slots: Sequence[Slot], replica_id: str, interpreter: str,
                      folder: Path) -> LocalReplica:
        """The launch's own process: on a port of this machine, or in its sandbox on a unix socket."""
        secret, gpus, name = new_secret(), gpu_indices(slots), f"{launch.kind}-{replica_id}"
        if self.sandboxes is not None and launch.sandbox is not None:
            server = self.sandboxes.server(launch, replica_id, interpreter, folder, secret,
                                           launch.visible_gpus(gpus), gpus)
            if server.egress is not None:
                self._egress[replica_id] = server.egress
            proc = self._spawn(server.command, name, 0, server.env)
            replica = LocalReplica(replica_id, unix_base_url(str(server.socket)), proc, warm=False, secret=secret)
            if launch.kind == "model":
                self._sandbox_of[replica_id] = model_sandbox_name(replica_id)
                replica.adapter_inbox = self.sandboxes.models.inbox(model_sandbox_name(replica_id))
            return replica
        if launch.sandbox is not None:
            raise ColdStartFailed("the launch asks for a sandbox, which the operator turned off here")
        port = free_port(self.settings.host)
        proc = self._spawn(launch.command(interpreter, str(folder), self.settings.host, port), name, port,
                           launch.environment(os.environ, secret, launch.visible_gpus(gpus)))
        return LocalReplica(replica_id, f"http://{self.settings.host}:{port}", proc, warm=False, secret=secret)

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
            self.sandboxes.functions.remove(replica_id)

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
            replica.adapter_inbox = self._adopted_inbox(replica.replica_id)
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

    def _adopted_inbox(self, replica_id: str) -> Optional[Path]:
        """An adopted model replica's adapter inbox, where its sandbox has one: a replica an
        older pool started has none, nor the flag that names it, and takes bodies."""
        name = self._sandbox_of.get(replica_id)
        if name is None or self.models is None or not self.models.inbox(name).is_dir():
            return None
        return self.models.inbox(name)

    def _adopt_egress(self, replica_id: str, hosts: tuple[str, ...]) -> None:
        """The proxy of a function replica's granted hosts, which died with the earlier pool."""
        if hosts and self.sandboxes is not None:
            proxy = self.sandboxes.functions.egress_proxy(replica_id, hosts)
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
        await self._tell_all()                   # what was just loaded is likely again
        while not self._closed and len(self._warm) < self.settings.warm_pool_size:
            try:
                warm = self._spawn_standby()
            except ColdStartFailed as exc:          # no sandbox here: cold starts say why
                log.warning("no standby: %s", exc)
                return
            self._warm.append(warm)
            if not await self._watch_standby(warm):
                return                       # broken runtime: retry at the next refill
            await self._tell(warm, self.likely_models())

    def expect(self, revision_ids: Sequence[str]) -> None:
        """Standbys waiting are told again when the models they will likely load change,
        after any refill under way (which tells them itself, once the load it follows is
        done: a standby's parse would slow that load on a node of few cores)."""
        self._expected = tuple(revision_ids)
        likely = self.likely_models()
        untold = any(w.told != likely for w in self.waiting())
        busy = any(t is not None and not t.done() for t in (self._refilling, self._telling))
        if untold and not busy and not self._closed:
            self._telling = asyncio.ensure_future(self._tell_all())

    def likely_models(self) -> tuple[str, ...]:
        return likely_models(self._expected, self._loads)

    def waiting(self) -> list[WarmProcess]:
        """Standbys up, waiting and able to see the pool's model folders (unconfined)."""
        return [w for w in self._warm if w.sandbox is None and w.ready.done() and not _failed(w.ready)]

    async def _tell_all(self) -> None:
        likely = self.likely_models()
        for warm in self.waiting():
            await self._tell(warm, likely)

    async def _tell(self, warm: WarmProcess, likely: tuple[str, ...]) -> None:
        """A hint, never needed: a standby that does not take it loads as before."""
        if warm.sandbox is not None or warm.told == likely:
            return
        try:
            resp = await self.http.post(f"{warm.base_url}{LIKELY_PATH}", json=LikelyModels(likely).to_json(),
                                        headers=auth_headers(warm.secret))
        except httpx.HTTPError as exc:
            log.info("standby pid %d not told its likely models: %r", warm.process.pid, exc)
            return
        if resp.status_code == LOAD_ACCEPTED:
            warm.told = likely

    def _spawn_standby(self) -> WarmProcess:
        """A standby at STANDBY_NICE until it is taken: its start (an interpreter and torch
        importing, ~2 CPU-seconds) yields to the cold start that triggered the refill."""
        warm = self._spawn_warm()
        warm.process.set_nice(STANDBY_NICE)
        return warm

    def _spawn_warm(self) -> WarmProcess:
        secret, ready = new_secret(), asyncio.get_running_loop().create_future()
        env, python = runtime_env(self.settings.runtime_threads, secret), self.settings.runtime_python
        if self.models is not None:
            name = f"standby-{uuid.uuid4().hex[:12]}"
            server = self.models.server(name, python, env, None, [], lambda: ["-m", MODEL_SERVER, "--standby"])
            proc = self._spawn(server.command, name, 0, server.env)
            return WarmProcess(proc, unix_base_url(str(server.socket)), ready, secret, sandbox=name)
        port = free_port(self.settings.host)
        command = [python, "-m", MODEL_SERVER, "--standby", "--host", self.settings.host, "--port", str(port)]
        proc = self._spawn(command, f"standby-{port}", port, {**os.environ, **env})
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

    def _spawn(self, args: list[str], name: str, port: int, env: dict[str, str]) -> RuntimeProcess:
        proc = RuntimeProcess.spawn(args, env, self.settings.logs / f"{name}.log")
        self._all[proc.pid] = proc
        self._state.write(ProcessEntry(proc.pid, proc.started, port, proc.log_path))
        log.info("started %s pid %d", name, proc.pid)
        return proc


def _kill_all(processes: dict[int, RuntimeProcess]) -> None:
    for proc in list(processes.values()):
        proc.kill_now()


def needs_own_process(slots: Sequence[Slot]) -> bool:
    return sum(1 for s in slots if s.kind == "cuda") > 1


def _failed(fut: asyncio.Future[Any]) -> bool:
    return fut.done() and (fut.cancelled() or fut.exception() is not None)
