"""What a function replica's process gets from the pool: its venv, and a clean environment.

The venv is built (or found, cached by the requirements' hash) by
`python -m runtime.functions.env` in a child process of its own: pip may run a
dependency's build code, which must never run in the pool's process. The cold
start times it as its own stage (`ColdStartTimings.env_s`). On the local backend
the pool runs it (`build_env`); on Ray the replica's actor runs the same command
on its node, under that node's cache (`builder_command`), and the pool reads its
answer with `built_env`.

Neither the installer nor the function server inherits the pool's environment:
it holds the platform's S3 keys and database URL. Each gets an allowlist of
plain variables (the installer also the proxies it needs to reach an index, and
the index the operator named for tenants, `function_index_url`: never the
installer's own PIP_*/UV_* settings, which may carry its credentials), plus what
the runtime needs (this checkout on PYTHONPATH, runtime_args.runtime_env); the
server's is made by its launch (pool/launch.py: `ReplicaLaunch.environment`).

With the sandbox on (pool/function_sandbox.py), the build runs in one, as its
tenant's uid, into that tenant's own venv folder.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from pool.api import ColdStartFailed
from pool.backends.runtime_args import PROJECT_ROOT
from pool.egress import EgressProxy, allowed_hosts
from pool.function_sandbox import EGRESS, EGRESS_SOCKET, PACKAGE, FunctionSandboxes
from pool.settings import PoolSettings

PLAIN_VARS = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ")
INSTALLER_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
                  "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
BASE_MEMORY_MB = 3072


@dataclass(frozen=True)
class FunctionEnv:
    python: str
    cached: bool
    seconds: float


def plain_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables any child may see: nothing that holds a credential."""
    return {k: environ[k] for k in PLAIN_VARS if k in environ}


def installer_env(environ: Mapping[str, str], index_url: Optional[str] = None) -> dict[str, str]:
    passed = {k: v for k, v in environ.items() if k in INSTALLER_VARS}
    index = {"PIP_INDEX_URL": index_url, "UV_INDEX_URL": index_url} if index_url else {}
    return {**plain_env(environ), **passed, **index}


def builder_command(python: str, package_dir: Path, envs_root: Path) -> list[str]:
    """`python -m runtime.functions.env` for the package, its venvs kept in envs_root (a
    folder of the node's cache: the pool's on the local backend, the node's own on Ray)."""
    return [python, "-m", "runtime.functions.env", "--package", str(package_dir), "--root", str(envs_root)]


def tenant_envs_root(cache_dir: Path, tenant_id: str) -> Path:
    """An unsandboxed node's venvs of one tenant: no tenant's build writes where another's
    replica reads."""
    return Path(cache_dir) / "function-envs" / f"t-{hashlib.sha256(tenant_id.encode()).hexdigest()[:16]}"


def builder_env(environ: Mapping[str, str], index_url: Optional[str] = None) -> dict[str, str]:
    """The installer's whole environment: installer_env plus this checkout importable."""
    return {**installer_env(environ, index_url), "PYTHONPATH": str(PROJECT_ROOT)}


async def build_env(settings: PoolSettings, package_dir: Path, sandboxes: Optional[FunctionSandboxes],
                    tenant_id: str) -> FunctionEnv:
    """The package's venv on this node; ColdStartFailed with the installer's reason."""
    build = Build.of(settings, settings.runtime_python, package_dir, sandboxes, tenant_id,
                     f"build-{uuid.uuid4().hex[:12]}")
    try:
        proc = await asyncio.create_subprocess_exec(
            *build.command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL, env=build.env, start_new_session=True)
        try:
            out, err = await proc.communicate()
        except asyncio.CancelledError:          # the stage timed out, or the pool stops
            _kill_group(proc.pid)
            await proc.wait()
            raise
    finally:
        build.close()
    return built_env(proc.returncode, out, err)


@dataclass
class Build:
    """One run of the installer: its command line and environment, and in a sandbox the
    cgroups (`name`) and the egress proxy to the index that `close` ends."""
    command: list[str]
    env: dict[str, str]
    name: str
    sandboxes: Optional[FunctionSandboxes] = None
    proxy: Optional[EgressProxy] = None

    @classmethod
    def of(cls, settings: PoolSettings, python: str, package_dir: Path, sandboxes: Optional[FunctionSandboxes],
           tenant_id: str, name: str) -> "Build":
        """In the tenant's sandbox (no network: the index only, through the proxy, where the
        package brings no wheels/), else with the tenant's own venvs folder."""
        env = builder_env(os.environ, settings.function_index_url)
        if sandboxes is None:
            return cls(builder_command(python, package_dir, tenant_envs_root(settings.cache_dir, tenant_id)), env,
                       name)
        uid = sandboxes.uid(tenant_id)
        root = sandboxes.envs_root(uid)
        command = builder_command(python, PACKAGE, root)
        proxy = None
        if not (package_dir / "wheels").is_dir():
            proxy = EgressProxy(sandboxes.egress_folder(name) / EGRESS_SOCKET,
                                allowed_hosts(settings.function_index_url))
            proxy.start()
            command += ["--egress-socket", str(EGRESS / EGRESS_SOCKET)]
        profile = sandboxes.build_profile(uid, package_dir, root, sandboxes.egress_folder(name) if proxy else None)
        return cls(sandboxes.sandbox.command(name, profile, command), {**env, "HOME": "/tmp", "TMPDIR": "/tmp"},
                   name, sandboxes, proxy)

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
        if self.sandboxes is not None:
            self.sandboxes.sandbox.release(self.name)
            self.sandboxes.remove_egress(self.name)


def built_env(returncode: int | None, out: bytes, err: bytes) -> FunctionEnv:
    """What the installer's exit and output say: its venv, or ColdStartFailed with its reason."""
    try:
        answer = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ColdStartFailed(f"building the function's environment failed ({returncode}): "
                              f"{err.decode(errors='replace')[-300:]}") from None
    if returncode != 0 or "error" in answer:
        raise ColdStartFailed(f"building the function's environment failed: {answer.get('error')}")
    return FunctionEnv(str(answer["python"]), bool(answer["cached"]), float(answer["seconds"]))


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def memory_limit_mb(gpu_memory_gb: float, slot_count: int, on_cuda: bool) -> Optional[int]:
    """A CPU replica's address space: the memory its slots reserved plus the interpreter
    and torch (about 1 GB mapped). None on CUDA, whose driver maps far more address
    space than it uses."""
    if on_cuda:
        return None
    return BASE_MEMORY_MB + int(gpu_memory_gb * 1024 * max(1, slot_count))

