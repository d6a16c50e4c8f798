"""The sandboxes of a function: its venv build and its server, each as its tenant's uid.

What each sees (pool/sandbox.py makes it so):
  build   its package's files read-only at /srv/package, its tenant's venv folder
          writable (venvs are per tenant: one tenant's build never writes where
          another's replica reads), network only when the package brings no wheels
  server  its package read-only at /srv/package, its venv read-only at /srv/venv, its replica
          folder at /run/replica: the unix socket the pool reaches it on and the
          secret file, which only the tenant's uid may read; no network at all

The package folder in the pool's cache is a folder of symlinks into the cache's
entries (pool/weights.py); each file is bound by its target, so the sandbox
sees its own files and no other entry of the cache.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from pool.api import ColdStartFailed
from pool.backends.runtime_args import PROJECT_ROOT
from pool.cgroups import Limits
from pool.inventory import Slot
from pool.sandbox import Bind, Platform, Sandbox, SandboxProfile
from pool.settings import MB, PoolSettings

PACKAGE = Path("/srv/package")
VENV = Path("/srv/venv")               # a venv runs from anywhere but for its console scripts
REPLICA = Path("/run/replica")
SOCKET = "http.sock"
SECRET = "secret"


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
        _own_folder(root, uid, 0o755)
        return root

    def build_profile(self, uid: int, package_dir: Path, root: Path) -> SandboxProfile:
        """A build's profile, its tenant's venvs folder (`envs_root`) writable."""
        binds = (*package_binds(package_dir), Bind(root, root, writable=True))
        return SandboxProfile(uid, binds, self._limits(None), self.settings.sandbox_tmp_mb * MB,
                              network=not (package_dir / "wheels").is_dir())

    def replica_dir(self, replica_id: str) -> Path:
        return self.settings.replica_state_dir / "sandbox" / "replicas" / replica_id

    def server_profile(self, uid: int, replica_id: str, package_dir: Path, python: str, secret: str,
                       memory_mb: int | None, devices: tuple[Path, ...] = ()) -> SandboxProfile:
        """The server's profile; writes its replica folder (socket and secret) first."""
        folder = self.replica_dir(replica_id)
        shutil.rmtree(folder, ignore_errors=True)
        _own_folder(folder, uid, 0o700)
        secret_file = folder / SECRET
        fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "w") as out:
            out.write(secret)
        os.chown(secret_file, uid, uid)
        venv = Path(python).parent.parent
        binds = (*package_binds(package_dir), Bind(venv, VENV), Bind(folder, REPLICA, writable=True))
        return SandboxProfile(uid, binds, self._limits(memory_mb), self.settings.sandbox_tmp_mb * MB,
                              devices=devices)

    def socket_path(self, replica_id: str) -> Path:
        return self.replica_dir(replica_id) / SOCKET

    def remove(self, replica_id: str) -> None:
        self.sandbox.release(server_name(replica_id))
        shutil.rmtree(self.replica_dir(replica_id), ignore_errors=True)

    def _limits(self, memory_mb: int | None) -> Limits:
        return Limits(memory_mb * MB if memory_mb else None, self.settings.sandbox_pids, self.settings.sandbox_cpus)


def server_name(replica_id: str) -> str:
    """What names a replica's server in its sandbox (its cgroups)."""
    return f"replica-{replica_id}"


def cuda_devices(slots: Sequence[Slot]) -> tuple[Path, ...]:
    """The device files of the slots' GPUs and the driver's shared ones, where present:
    a sandbox sees no other GPU."""
    own = [f"/dev/nvidia{s.device_index}" for s in slots if s.kind == "cuda" and s.device_index is not None]
    shared = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"] if own else []
    return tuple(Path(p) for p in [*own, *shared] if os.path.exists(p))


def package_binds(package_dir: Path) -> tuple[Bind, ...]:
    """Each file of the package folder, by its link's target, under /srv/package."""
    return tuple(Bind(path.resolve(), PACKAGE / path.relative_to(package_dir))
                 for path in _files(package_dir))


def _files(folder: Path) -> Iterator[Path]:
    for root, _, names in os.walk(folder):
        for name in sorted(names):
            yield Path(root) / name


def _own_folder(folder: Path, uid: int, mode: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    os.chown(folder, uid, uid)
    os.chmod(folder, mode)
