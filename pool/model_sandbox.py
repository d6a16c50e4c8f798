"""The sandbox of a model replica: the runtime's server as a uid of its own, seeing its model only.

A model's files are tenant input too (its GGUF, safetensors headers, tokenizer and
chat template), and the process that parses them serves every call of the replica.
Each model replica process (a warm standby too) runs in pool/sandbox.py's sandbox
with a uid of its own (`ReplicaUids`: a standby starts before its tenant is known)
and, under the node's cache, a folder of its own:

  run/     its uid's alone, at /run/replica: the secret file and its unix socket;
           no network at all
  model/   read-only at /srv/model: hard links to the cache entries of the model it
           serves, made when it is placed (a standby's folder is bound empty at its
           start and filled at its load, so a standby still skips the interpreter's
           start), so it sees no other entry of the cache; draft/ likewise at
           /srv/draft for a speculative draft model
  packed/  writable at /srv/packed: its packed-layer cache (runtime/load/packed_weights.py),
           hard links to its tenant's packed files; what it packs anew is moved to its
           tenant's packed folder when it has stopped, so no tenant maps another's
  adapters/ read-only at /srv/adapters, root's: its adapter inbox (the server's
           --adapter-inbox). The pool hard-links a LoRA adapter's weights from the
           cache here for the PUT that names the file and removes the link after the
           reply (pool/adapter_inbox.py), so it holds only what is being loaded into
           this replica, nothing of any other

The kernels the node built ahead (`prebuild_kernels`) are read-only at /srv/kernels.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from pool.api import ColdStartFailed
from kernels.cpu.build import KERNELS_DIR_ENV
from wire.replica_control import ADAPTER_INBOX_FLAG
from wire.replica_secret import SECRET_ENV
from pool.function_sandbox import REPLICA, RUN_ROOT, SECRET, SOCKET, cuda_devices, sandbox_limits, secret_as_file
from pool.sandbox import (Bind, Sandbox, SandboxedServer, SandboxProfile, files_under, own_folder, replica_folder,
                          sandbox_env)
from pool.settings import MB, PoolSettings
from spec.engine_options import ChosenOptions

log = logging.getLogger(__name__)

MODEL = Path("/srv/model")
DRAFT = Path("/srv/draft")
PACKED = Path("/srv/packed")
KERNELS = Path("/srv/kernels")
ADAPTER_INBOX = Path("/srv/adapters")
KERNELS_BUILD_TIMEOUT_S = 300
PACK_NAME = re.compile(r"[0-9a-f]{32}\.pack")
TENANT_FILE = "tenant"


@dataclass(frozen=True)
class ModelSandboxes:
    sandbox: Sandbox
    settings: PoolSettings

    @property
    def root(self) -> Path:
        """Under the weight cache's own folder: its entries hard-link into ours."""
        return Path(self.settings.cache_dir) / "sandbox" / "models"

    @property
    def kernels_dir(self) -> Path:
        return self.sandbox.state_dir / "kernels"

    def folder(self, name: str) -> Path:
        return self.root / name

    def run_folder(self, name: str) -> Path:
        """Its socket and secret: under /run (a socket's path is short), not the cache."""
        return RUN_ROOT / name

    def socket_path(self, name: str) -> Path:
        return self.run_folder(name) / SOCKET

    def inbox(self, name: str) -> Path:
        """Its adapter inbox as the host sees it (ADAPTER_INBOX inside)."""
        return self.folder(name) / "adapters"

    def profile(self, name: str, secret: str, memory_mb: Optional[int],
                devices: tuple[Path, ...] = ()) -> SandboxProfile:
        """A new replica process's folder (empty model, no tenant yet) and profile;
        ColdStartFailed where no sandbox can be made here (fail closed)."""
        problem = self.sandbox.check()
        if problem is not None:
            raise ColdStartFailed(f"the sandbox cannot start on this node, so no model replica runs: {problem}")
        uid = self.sandbox.replica_uids().take()
        folder = self.folder(name)
        self._make_folders(name, uid, secret)
        binds = (Bind(self.run_folder(name), REPLICA, writable=True), Bind(folder / "model", MODEL),
                 Bind(folder / "draft", DRAFT), Bind(folder / "packed", PACKED, writable=True),
                 Bind(self.inbox(name), ADAPTER_INBOX), *self._kernels())
        return SandboxProfile(uid, binds, sandbox_limits(self.settings, memory_mb), self.settings.sandbox_tmp_mb * MB,
                              devices=devices)

    def _make_folders(self, name: str, uid: int, secret: str) -> None:
        folder = self.folder(name)
        shutil.rmtree(folder, ignore_errors=True)
        replica_folder(self.run_folder(name), uid, secret, SECRET)
        folder.mkdir(mode=0o755, parents=True)
        (folder / "model").mkdir(mode=0o755)
        (folder / "draft").mkdir(mode=0o755)
        self.inbox(name).mkdir(mode=0o755)          # root's: only the pool puts files there
        own_folder(folder / "packed", uid, 0o755)

    def server(self, name: str, python: str, env: Mapping[str, str], memory_mb: Optional[int],
               gpus: Sequence[int], args: Callable[[], list[str]]) -> SandboxedServer:
        """`python <args()>` (runtime.serve.server and its arguments) in the sandbox `name`, on
        its unix socket; `env` is what an unconfined server would add to the node's environment
        (its secret among it), `gpus` its GPUs' device indices; args() runs once the folder is made."""
        try:
            profile = self.profile(name, env[SECRET_ENV], memory_mb, cuda_devices(gpus))
            argv = [python, *args(), "--uds", str(REPLICA / SOCKET), ADAPTER_INBOX_FLAG, str(ADAPTER_INBOX)]
            command = self.sandbox.command(name, profile, argv)
        except BaseException:
            self.remove(name)                # no half-made folder or group outlives a failed start
            raise
        inside = {**secret_as_file(env), KERNELS_DIR_ENV: str(KERNELS)}
        return SandboxedServer(command, sandbox_env(os.environ, inside), self.socket_path(name))

    def place(self, name: str, model_dir: Path, tenant_id: str, memory_mb: Optional[int],
              engine: ChosenOptions) -> ChosenOptions:
        """The model's files (its draft's too) and its tenant's packed layers into the
        process's folder; the engine options as the process sees them."""
        folder = self.folder(name)
        (folder / TENANT_FILE).write_text(tenant_id)
        _link_files(model_dir, folder / "model")
        speculative = engine.get("speculative")
        if isinstance(speculative, dict) and speculative.get("model"):
            _link_files(Path(speculative["model"]), folder / "draft")
            engine = engine.with_(speculative={**speculative, "model": str(DRAFT)})
        for pack in self._tenant_packs(tenant_id).glob("*.pack"):
            os.utime(pack)                 # recently used: the last its tenant's budget evicts
            link_or_copy(pack, folder / "packed" / pack.name)
        if memory_mb is not None and not self.sandbox.cgroups.limit_memory(name, memory_mb * MB):
            log.warning("no memory limit for %s: the host refused it", name)
        return engine.with_(packed_cache_dir=str(PACKED)) if "packed_cache_dir" in engine else engine

    def remove(self, name: str) -> None:
        """A stopped process's cgroups and folder, its new packed layers kept for its tenant."""
        self.sandbox.release(name)
        folder = self.folder(name)
        try:
            tenant_id = (folder / TENANT_FILE).read_text()
        except OSError:
            tenant_id = None
        if tenant_id is not None:
            self._keep_packs(name, tenant_id)
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(self.run_folder(name), ignore_errors=True)

    def kernels_build(self, python: str) -> list[str]:
        """The command that builds the C kernels once for every sandbox (their /tmp is their
        own); a kernel missing there is built inside the sandbox, slower but the same."""
        return [python, "-m", "kernels.cpu.build", str(self.kernels_dir)]

    def prebuild_kernels(self, python: str, env: dict[str, str]) -> None:
        done = subprocess.run(self.kernels_build(python), env=env, capture_output=True,
                              timeout=KERNELS_BUILD_TIMEOUT_S, stdin=subprocess.DEVNULL)
        _built(done.returncode, done.stderr)

    async def prebuild_kernels_async(self, python: str, env: dict[str, str]) -> None:
        """prebuild_kernels, stopped by a cancel: a pool closed during the build (a start
        then a stop at once) does not wait for the compiler. The build and its compilers
        are a process group of their own, killed whole; each library is renamed into place
        once written (kernels/cpu/build.py), so a build cut short leaves none half-made."""
        proc = await asyncio.create_subprocess_exec(
            *self.kernels_build(python), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, start_new_session=True)
        try:
            _, stderr = await asyncio.wait_for(proc.communicate(), KERNELS_BUILD_TIMEOUT_S)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise
        _built(proc.returncode, stderr)

    def _kernels(self) -> tuple[Bind, ...]:
        return (Bind(self.kernels_dir, KERNELS),) if self.kernels_dir.is_dir() else ()

    def _tenant_packs(self, tenant_id: str) -> Path:
        """The tenant's packed layers, by a digest of its id (a path of any id is safe)."""
        folder = Path(self.settings.packed_dir) / "tenants" / sha256(tenant_id.encode()).hexdigest()[:32]
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        return folder

    def _keep_packs(self, name: str, tenant_id: str) -> None:
        """Files the process packed (its own, plain, whole) become its tenant's, read-only
        and root's; then its tenant's least recently used go beyond the node's budget."""
        packed, uid = self.folder(name) / "packed", _owner(self.run_folder(name))
        keep = self._tenant_packs(tenant_id)
        for path in packed.iterdir() if packed.is_dir() else ():
            info = path.lstat()
            if (PACK_NAME.fullmatch(path.name) and stat.S_ISREG(info.st_mode) and info.st_uid == uid
                    and info.st_nlink == 1):
                os.chown(path, 0, 0)
                os.chmod(path, 0o444)
                os.replace(path, keep / path.name)
        _evict(keep, int(self.settings.packed_cache_gb * (1 << 30)))


def _built(returncode: Optional[int], stderr: bytes) -> None:
    if returncode != 0:
        log.warning("kernels not built ahead: %s", stderr.decode(errors="replace").strip()[-500:])


def _owner(path: Path) -> Optional[int]:
    try:
        return path.stat().st_uid
    except OSError:
        return None


def _evict(folder: Path, budget: int) -> None:
    packs = sorted(((p.stat().st_mtime, p.stat().st_size, p) for p in folder.glob("*.pack")), reverse=True)
    total = 0
    for _, size, path in packs:
        total += size
        if total > budget:
            path.unlink(missing_ok=True)


def _link_files(source: Path, target: Path) -> None:
    for path in files_under(source):
        linked = target / path.relative_to(source)
        linked.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        link_or_copy(path.resolve(), linked)


def link_or_copy(source: Path, target: Path) -> None:
    """A hard link (the cache's entries are read-only to all); a copy, read-only to all,
    where the sandbox folder is on another filesystem than the file or the filesystem
    refuses the link, or where the file is not for all to read (a folder given to a Ray
    node as it is: a link would share its mode)."""
    if source.stat().st_mode & stat.S_IROTH:
        try:
            os.link(source, target)
            return
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM):
                raise
    shutil.copyfile(source, target)
    os.chmod(target, 0o444)
