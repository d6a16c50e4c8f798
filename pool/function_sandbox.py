"""The sandboxes of a function: its venv build and its server, each as its tenant's uid.

What each sees (pool/sandbox.py makes it so):
  build   its package's files read-only at /srv/package, its tenant's venv folder
          writable (venvs are per tenant: one tenant's build never writes where
          another's replica reads), network only when the package brings no wheels
  server  its package read-only at /srv/package, its venv read-only at /srv/venv, its replica
          folder at /run/replica: the unix socket the pool reaches it on and the
          secret file, which only the tenant's uid may read; no network at all

The package folder in the pool's cache is a folder of symlinks into the cache's
entries (pool/weights/cache.py); each file is bound by its target, so the sandbox
sees its own files and no other entry of the cache.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Optional, Sequence

from pool.api import ColdStartFailed
from pool.backends.runtime_args import PROJECT_ROOT
from wire.replica_secret import SECRET_ENV, SECRET_FILE_ENV
from pool.cgroups import CgroupLimits
from pool.egress import EgressProxy, parse_host
from pool.inventory import Slot
from pool.sandbox import (Bind, Platform, Sandbox, SandboxedServer, SandboxProfile, files_under, own_folder,
                          replica_folder, sandbox_env)
from pool.settings import MB, PoolSettings
from wire.socket_forward import EGRESS_SOCKET_ENV

PACKAGE = Path("/srv/package")
VENV = Path("/srv/venv")               # a venv runs from anywhere but for its console scripts
REPLICA = Path("/run/replica")
SOCKET = "http.sock"
SECRET = "secret"
EGRESS = Path("/run/egress")           # a build's way to the index (pool/egress.py)
EGRESS_SOCKET = "proxy.sock"
EGRESS_ROOT = Path("/run/thawpool-egress")  # on the host: the proxies' sockets
# on the host: each sandboxed server's folder (its socket, its secret), under /run because a
# unix socket's path has at most 107 bytes, which a deep state dir leaves too few of
RUN_ROOT = Path("/run/thawpool-replicas")


@dataclass(frozen=True)
class FunctionSandboxes:
    sandbox: Sandbox
    settings: PoolSettings

    @classmethod
    def from_settings(cls, settings: PoolSettings) -> "FunctionSandboxes | None":
        """None where the operator turned the sandbox off (THAWPOOL_SANDBOX=off)."""
        if settings.sandbox == "off":
            return None
        sandbox = Sandbox(settings.replica_state_dir / "sandbox", Platform.of_this_interpreter(PROJECT_ROOT),
                          settings.sandbox_uid_base)
        return cls(sandbox, settings)

    def uid(self, tenant_id: str) -> int:
        """The tenant's uid; ColdStartFailed where no sandbox can be made (fail closed)."""
        problem = self.sandbox.check()
        if problem is not None:
            raise ColdStartFailed(f"the sandbox cannot start on this node, so no function runs: {problem}")
        return self.sandbox.uids().uid(tenant_id)

    def envs_root(self, uid: int) -> Path:
        """The tenant's venvs on this node, owned by its uid."""
        root = Path(self.settings.cache_dir) / "function-envs" / str(uid)
        own_folder(root, uid, 0o755)
        return root

    def build_profile(self, uid: int, package_dir: Path, root: Path, egress: Optional[Path]) -> SandboxProfile:
        """A build's profile, its tenant's venvs folder (`envs_root`) writable, no network:
        the egress proxy's folder (pool/egress.py) at /run/egress where it needs the index."""
        binds = (*package_binds(package_dir), Bind(root, root, writable=True),
                 *([Bind(egress, EGRESS)] if egress is not None else []))
        return SandboxProfile(uid, binds, self._limits(None), self.settings.sandbox_tmp_mb * MB)

    def egress_folder(self, name: str) -> Path:
        """The folder of an egress proxy's socket (a build's, a server's): root's, which any
        uid may enter. Under /run, not the state dir: a unix socket's path has at most 107
        bytes, which a deep state dir leaves too few of. Names are unique (a uuid, a replica id)."""
        folder = EGRESS_ROOT / name
        folder.mkdir(mode=0o755, parents=True, exist_ok=True)
        return folder

    def remove_egress(self, name: str) -> None:
        shutil.rmtree(EGRESS_ROOT / name, ignore_errors=True)

    def replica_dir(self, replica_id: str) -> Path:
        return RUN_ROOT / replica_id

    def server_profile(self, uid: int, replica_id: str, package_dir: Path, python: str, secret: str,
                       memory_mb: int | None, devices: tuple[Path, ...] = ()) -> SandboxProfile:
        """The server's profile; writes its replica folder (socket and secret) first."""
        folder = self.replica_dir(replica_id)
        replica_folder(folder, uid, secret, SECRET)
        venv = Path(python).parent.parent
        binds = (*package_binds(package_dir), Bind(venv, VENV), Bind(folder, REPLICA, writable=True))
        return SandboxProfile(uid, binds, self._limits(memory_mb), self.settings.sandbox_tmp_mb * MB,
                              devices=devices)

    def server(self, tenant_id: str, replica_id: str, package_dir: Path, python: str, argv: Sequence[str],
               memory_mb: int | None, env: Mapping[str, str], gpus: Sequence[int],
               egress: Sequence[str] = ()) -> SandboxedServer:
        """runtime.functions.server as the tenant's uid, on a unix socket, its secret in a
        file; `argv` follows the venv's interpreter (the package at PACKAGE), `env` is the
        server's whole environment as an unconfined one would get it, `gpus` the device
        indices of its GPUs, `egress` the hosts its tenant was granted."""
        uid = self.uid(tenant_id)
        profile = self.server_profile(uid, replica_id, package_dir, python, env[SECRET_ENV], memory_mb,
                                      cuda_devices(gpus))
        args = [str(VENV / "bin" / "python"), *argv, "--uds", str(REPLICA / SOCKET)]
        inside = secret_as_file(env)
        proxy = self.egress_proxy(replica_id, egress)
        if proxy is not None:
            profile = replace(profile, binds=(*profile.binds, Bind(proxy.socket.parent, EGRESS)))
            inside[EGRESS_SOCKET_ENV] = str(EGRESS / EGRESS_SOCKET)
        command = self.sandbox.command(server_name(replica_id), profile, args)
        return SandboxedServer(command, sandbox_env(os.environ, inside), self.socket_path(replica_id), proxy)

    def egress_proxy(self, replica_id: str, hosts: Sequence[str]) -> Optional[EgressProxy]:
        """The proxy of the hosts its tenant was granted, listening; None without a grant.
        Started again at the same socket for a replica an earlier pool left running (its
        proxy ended with that pool's process)."""
        if not hosts:
            return None
        proxy = EgressProxy(self.egress_folder(server_name(replica_id)) / EGRESS_SOCKET,
                            frozenset(parse_host(h) for h in hosts))
        proxy.start()
        return proxy

    def socket_path(self, replica_id: str) -> Path:
        return self.replica_dir(replica_id) / SOCKET

    def remove(self, replica_id: str) -> None:
        self.sandbox.release(server_name(replica_id))
        shutil.rmtree(self.replica_dir(replica_id), ignore_errors=True)
        self.remove_egress(server_name(replica_id))

    def _limits(self, memory_mb: int | None) -> CgroupLimits:
        return sandbox_limits(self.settings, memory_mb)


def sandbox_limits(settings: PoolSettings, memory_mb: Optional[int]) -> CgroupLimits:
    """A sandboxed server's limits: its memory (None: none), the settings' pids and CPUs."""
    return CgroupLimits(memory_mb * MB if memory_mb else None, settings.sandbox_pids, settings.sandbox_cpus)


def server_name(replica_id: str) -> str:
    """What names a replica's server in its sandbox (its cgroups)."""
    return f"replica-{replica_id}"


def secret_as_file(env: Mapping[str, str]) -> dict[str, str]:
    """A server's environment with its secret named by its file in /run/replica in place
    of the secret itself (its uid alone may read the file)."""
    moved = {k: v for k, v in env.items() if k != SECRET_ENV}
    return {**moved, SECRET_FILE_ENV: str(REPLICA / SECRET)}


def gpu_indices(slots: Sequence[Slot]) -> list[int]:
    return [s.device_index for s in slots if s.kind == "cuda" and s.device_index is not None]


def cuda_devices(gpus: Sequence[int]) -> tuple[Path, ...]:
    """The device files of these GPUs and the driver's shared ones, where present: a
    sandbox sees no other GPU."""
    own = [f"/dev/nvidia{i}" for i in gpus]
    shared = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"] if own else []
    return tuple(Path(p) for p in [*own, *shared] if os.path.exists(p))


def package_binds(package_dir: Path) -> tuple[Bind, ...]:
    """Each file of the package folder, by its link's target, under /srv/package."""
    return tuple(Bind(path.resolve(), PACKAGE / path.relative_to(package_dir))
                 for path in files_under(package_dir))

