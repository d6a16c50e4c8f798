"""Local backend: each replica is a `python -m runtime.server` child on 127.0.0.1.

A warm pool keeps `warm_pool_size` standby processes (`--standby`: torch and
the engine imported, no model); a cold start takes one and POSTs
/admin/load, so it pays only for the weights. The pool is refilled in the
background. Without a warm process (pool empty, size 0, a runtime without
standby mode, or a multi-GPU replica that needs its own CUDA_VISIBLE_DEVICES)
the replica is started directly with `--model DIR`.
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import httpx

from pool.api import RevisionSpec
from pool.inventory import Slot
from pool.processes import ManagedProcess, free_port
from pool.settings import PoolSettings

log = logging.getLogger(__name__)
PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class LocalReplica:
    replica_id: str
    base_url: str
    process: ManagedProcess
    warm: bool                       # started from the warm pool

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def exit_reason(self) -> Optional[str]:
        code = self.process.returncode
        if code is None:
            return None
        tail = self.process.log_tail(300).splitlines()[-1:] or [""]
        return f"runtime process {self.process.pid} exited with code {code}: {tail[0]}".rstrip(": ")

    async def stop(self, timeout_s: float) -> None:
        await self.process.stop(timeout_s)


@dataclass
class WarmProcess:
    process: ManagedProcess
    port: int
    ready: asyncio.Future            # True once /health says standby


def runtime_has_standby() -> bool:
    """The runtime helper adds standby mode; look for it in runtime/server.py's source."""
    spec = importlib.util.find_spec("runtime.server")
    if spec is None or not spec.origin:
        return False
    text = Path(spec.origin).read_text(errors="replace")
    return "--standby" in text and "/admin/load" in text


def engine_flags(engine: Mapping[str, Any]) -> list[str]:
    """runtime.LLM kwargs as `python -m runtime.server` flags (for a direct start)."""
    flags = []
    for name, value in engine.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{name.replace('_', '-')}")
        elif isinstance(value, (dict, list)):
            flags += [flag, json.dumps(value)]
        elif value is not None:
            flags += [flag, str(value)]
    return flags


class LocalBackend:
    def __init__(self, settings: PoolSettings):
        self.settings = settings
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=2.0))
        self._warm: list[WarmProcess] = []
        self._all: dict[int, ManagedProcess] = {}          # every child, by PID
        self._refilling: Optional[asyncio.Task] = None
        self._closed = False
        # last resort if close() never ran (a crashed test, interpreter exit): SIGKILL by PID
        weakref.finalize(self, _kill_all, self._all)

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
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
        self._warm.clear()
        self._all.clear()
        await self.http.aclose()

    def warm_count(self) -> int:
        return sum(1 for w in self._warm if w.process.is_alive())

    def warm_pids(self) -> list[int]:
        return [w.process.pid for w in self._warm]

    # -- replicas ----------------------------------------------------------

    async def start_replica(self, spec: RevisionSpec, slots: Sequence[Slot], model_dir: Path,
                            replica_id: str) -> LocalReplica:
        engine = self.engine_for(spec, slots)
        warm = None if needs_own_process(slots) else await self._take_warm()
        if warm is not None:
            try:
                return await self._load_into(warm, model_dir, spec, engine, replica_id)
            finally:
                self.refill()
        return self._start_direct(spec, slots, model_dir, engine, replica_id)

    def engine_for(self, spec: RevisionSpec, slots: Sequence[Slot]) -> dict[str, Any]:
        engine = dict(spec.engine)
        engine.setdefault("kv_cache_tokens", self.settings.kv_cache_tokens_default)
        cuda = [s for s in slots if s.kind == "cuda"]
        if cuda and "device" not in spec.engine:
            engine["device"] = f"cuda:{cuda[0].device_index}" if len(cuda) == 1 else "cuda"
        if len(slots) > 1:
            engine.setdefault("tensor_parallel_size", len(slots))
        return engine

    async def _load_into(self, warm: WarmProcess, model_dir: Path, spec: RevisionSpec,
                         engine: dict, replica_id: str) -> LocalReplica:
        base_url = f"http://{self.settings.host}:{warm.port}"
        body = {"model": str(model_dir), "served_model_name": spec.revision_id, "engine": engine}
        try:
            resp = await self.http.post(f"{base_url}/admin/load", json=body)
        except httpx.HTTPError as exc:
            await self._discard(warm.process)
            raise RuntimeError(f"warm runtime did not take the load command: {exc!r}") from exc
        if resp.status_code != 202:
            await self._discard(warm.process)
            raise RuntimeError(f"warm runtime refused the load command: {resp.status_code} {resp.text[:300]}")
        return LocalReplica(replica_id, base_url, warm.process, warm=True)

    def _start_direct(self, spec: RevisionSpec, slots: Sequence[Slot], model_dir: Path,
                      engine: dict, replica_id: str) -> LocalReplica:
        port = free_port(self.settings.host)
        args = [*self._server_args(port), "--model", str(model_dir),
                "--served-model-name", spec.revision_id, *engine_flags(engine)]
        proc = self._spawn(args, f"replica-{replica_id}", slots)
        return LocalReplica(replica_id, f"http://{self.settings.host}:{port}", proc, warm=False)

    async def _discard(self, proc: ManagedProcess) -> None:
        await proc.stop(self.settings.stop_timeout_s)
        self._all.pop(proc.pid, None)

    def forget(self, handle: LocalReplica) -> None:
        """Drop a stopped replica's process from the registry."""
        self._all.pop(handle.process.pid, None)

    # -- warm pool ---------------------------------------------------------

    async def _take_warm(self) -> Optional[WarmProcess]:
        """A standby process: a ready one if any, else one still starting, else None."""
        self._warm = [w for w in self._warm if w.process.is_alive() and not _failed(w.ready)]
        if not self._warm:
            return None
        ready = [w for w in self._warm if w.ready.done()]
        warm = (ready or self._warm)[0]
        self._warm.remove(warm)
        try:
            await asyncio.wait_for(asyncio.shield(warm.ready), self.settings.load_timeout_s)
            return warm
        except asyncio.CancelledError:
            await self._discard(warm.process)
            raise
        except Exception:  # noqa: BLE001 - a standby that never came up: start directly
            await self._discard(warm.process)
            return None

    def refill(self) -> None:
        if self._closed or (self._refilling and not self._refilling.done()):
            return
        self._refilling = asyncio.ensure_future(self._refill())

    async def _refill(self) -> None:
        if not runtime_has_standby():
            return
        self._warm = [w for w in self._warm if w.process.is_alive() and not _failed(w.ready)]
        while not self._closed and len(self._warm) < self.settings.warm_pool_size:
            port = free_port(self.settings.host)
            proc = self._spawn([*self._server_args(port), "--standby"], f"standby-{port}", [])
            warm = WarmProcess(proc, port, asyncio.get_running_loop().create_future())
            self._warm.append(warm)
            if not await self._watch_standby(warm):
                return                       # broken runtime: retry at the next refill

    async def _watch_standby(self, warm: WarmProcess) -> bool:
        url = f"http://{self.settings.host}:{warm.port}/health"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.load_timeout_s
        while loop.time() < deadline and warm.process.is_alive():
            try:
                resp = await self.http.get(url, timeout=2.0)
                if resp.json().get("status") == "standby":
                    if not warm.ready.done():
                        warm.ready.set_result(True)
                    return True
            except (httpx.HTTPError, ValueError):
                pass
            await asyncio.sleep(self.settings.health_poll_s * 2)
        if not warm.ready.done():
            warm.ready.set_exception(RuntimeError(f"standby runtime did not come up: {warm.process.log_tail()}"))
        await self._discard(warm.process)
        return False

    # -- processes ---------------------------------------------------------

    def _server_args(self, port: int) -> list[str]:
        return [self.settings.runtime_python, "-m", "runtime.server",
                "--host", self.settings.host, "--port", str(port)]

    def _spawn(self, args: list[str], name: str, slots: Sequence[Slot]) -> ManagedProcess:
        proc = ManagedProcess(args, self._env(slots), self.settings.logs / f"{name}.log")
        self._all[proc.pid] = proc
        log.info("started %s pid %d", name, proc.pid)
        return proc

    def _env(self, slots: Sequence[Slot]) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
        if self.settings.runtime_threads:
            env["OMP_NUM_THREADS"] = str(self.settings.runtime_threads)
            env["MKL_NUM_THREADS"] = str(self.settings.runtime_threads)
        cuda = [s for s in slots if s.kind == "cuda"]
        if len(cuda) > 1:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(s.device_index) for s in cuda)
        return env


def _kill_all(processes: dict[int, ManagedProcess]) -> None:
    for proc in list(processes.values()):
        proc.kill_now()


def needs_own_process(slots: Sequence[Slot]) -> bool:
    return sum(1 for s in slots if s.kind == "cuda") > 1


def _failed(fut: asyncio.Future) -> bool:
    return fut.done() and (fut.cancelled() or fut.exception() is not None)
