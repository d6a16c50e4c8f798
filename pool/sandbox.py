"""The sandbox around every tenant process: bubblewrap, an unprivileged uid, seccomp, cgroups.

A tenant's code (a function's handler, the build code pip runs for its
requirements) is hostile input. Each such process starts as

    sh (joins its cgroups) -> prlimit -> bwrap (namespaces, mounts, seccomp)
       -> setpriv (the tenant's own uid, no capabilities, no_new_privs) -> the command

bwrap runs as root without a user namespace, so that the process inside gets a
real unprivileged uid of the host (one per tenant, `TenantUids`) rather than
root mapped into a namespace; setpriv drops to it and clears every capability.
Inside: its own PID, IPC, UTS, cgroup and (unless the profile allows network)
network namespaces; a root of its own holding only the system's /usr, the
platform's interpreter and packages, and what the profile binds (its package,
its venv, its socket folder), all read-only but that folder and a size-limited
/tmp. docs/security.md says why bubblewrap and what each line holds against.

`Sandbox.check()` says why the sandbox cannot run here (None: it can); the pool
then refuses to start a tenant process rather than run it unconfined.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal
import site
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence

from pool.cgroups import Cgroups, CgroupLimits
from pool.egress import EgressProxy
from pool.seccomp import SeccompUnavailable, write_filter

TOOLS = ("bwrap", "setpriv", "prlimit")
EMPTY_GROUP_AGE_S = 120.0      # a launcher joins its group within moments of its making
SHELL = os.path.realpath("/bin/sh")            # what a launcher (Sandbox.command) runs
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# the public CA certificates too: an installer checks the bundle its settings name at start
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/nsswitch.conf", "/etc/ssl", "/etc/ca-certificates")
NETWORK_FILES = ("/etc/resolv.conf", "/etc/hosts")
SECCOMP_FD = 9                      # sh (dash) redirects single-digit descriptors only
REPLICA_UIDS_FROM = 1_000_000       # model replicas' uids, above any tenant's (TenantUids)


@dataclass(frozen=True)
class Bind:
    source: Path                    # on the host
    target: Path                    # inside the sandbox
    writable: bool = False


@dataclass(frozen=True)
class SandboxProfile:
    """What one sandboxed process sees and may use."""
    uid: int
    binds: tuple[Bind, ...]
    limits: CgroupLimits
    tmp_bytes: int
    network: bool = False
    devices: tuple[Path, ...] = ()          # GPU device files it may open


@dataclass(frozen=True)
class SandboxedServer:
    """A sandboxed server as the host starts it, the unix socket it listens on, and the
    egress proxy of its granted hosts (its owner closes it when the server stops)."""
    command: list[str]
    env: dict[str, str]
    socket: Path
    egress: Optional[EgressProxy] = None


@dataclass(frozen=True)
class Platform:
    """The read-only code every sandboxed Python needs: the interpreter, the platform's
    environment (site-packages, torch) and this checkout's packages a replica imports."""
    paths: tuple[Path, ...]

    @classmethod
    def of_this_interpreter(cls, project_root: Path) -> "Platform":
        roots = {Path(sys.base_prefix), Path(sys.prefix), *map(Path, site.getsitepackages())}
        own = [project_root / name for name in ("runtime", "spec", "wire", "kernels")]
        # by their real paths, and by a link's too (a venv reached through a link to it)
        return cls(_outermost({p.resolve() for p in roots} | roots | set(own)))


class TenantUids:
    """One host uid per tenant, handed out in order from `base` and kept in a file, so
    that two tenants never share one (a hash could collide) and a tenant keeps its uid
    across restarts (its venvs are owned by it)."""

    def __init__(self, path: Path, base: int):
        self.path, self.base = path, base

    def uid(self, tenant_id: str) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            known: dict[str, int] = json.loads(self.path.read_text()) if self.path.exists() else {}
            if tenant_id not in known:
                known[tenant_id] = max(known.values(), default=self.base - 1) + 1
                staging = self.path.with_suffix(".tmp")
                staging.write_text(json.dumps(known))
                os.replace(staging, self.path)
            return known[tenant_id]


class ReplicaUids:
    """A uid of its own for each model replica process, from `base` on in turn: a warm
    standby starts before any tenant is known, so its uid cannot be its tenant's. One
    still held by a running process is passed over, so no two live replicas share one."""

    def __init__(self, path: Path, base: int, span: int = 1 << 16):
        self.path, self.base, self.span = path, base, span

    def take(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            start = int(self.path.read_text() or 0) if self.path.exists() else 0
            busy = running_uids()
            turn = next((t for t in range(start, start + self.span) if self.base + t % self.span not in busy), start)
            self.path.write_text(str(turn + 1))
            return self.base + turn % self.span


def _is_launcher(pid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == 0 and os.readlink(f"/proc/{pid}/exe") == SHELL
    except OSError:
        return False


def running_uids() -> set[int]:
    """The real uids of this host's processes."""
    uids = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            line = next(x for x in status.read_text().splitlines() if x.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        uids.add(int(line.split()[1]))
    return uids


@dataclass
class Sandbox:
    state_dir: Path                 # the seccomp program and the uid table live here
    platform: Platform
    uid_base: int = 200_000
    cgroups: Cgroups = field(default_factory=Cgroups)
    _problem: Optional[str] = field(default=None, init=False)
    _checked: bool = field(default=False, init=False)

    @property
    def seccomp_path(self) -> Path:
        return self.state_dir / "seccomp.bpf"

    def uids(self) -> TenantUids:
        return TenantUids(self.state_dir / "tenant-uids.json", self.uid_base)

    def replica_uids(self) -> ReplicaUids:
        return ReplicaUids(self.state_dir / "replica-uid-turn", self.uid_base + REPLICA_UIDS_FROM)

    def check(self) -> Optional[str]:
        """Why no process can be sandboxed on this node, or None; asked once."""
        if not self._checked:
            self._problem, self._checked = self._find_problem(), True
        return self._problem

    def _find_problem(self) -> Optional[str]:
        missing = [tool for tool in TOOLS if shutil.which(tool) is None]
        if missing:
            return f"{', '.join(missing)} not installed (Debian: bubblewrap, util-linux)"
        if os.geteuid() != 0:
            return "the pool must run as root to give each tenant its own uid"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            write_filter(self.seccomp_path)
        except (SeccompUnavailable, OSError) as exc:
            return f"no seccomp filter: {exc}"
        profile = SandboxProfile(self.uid_base, (), CgroupLimits(None, 64, None), 1 << 20)
        name = f"check-{os.getpid()}"         # several processes of a node check at once (Ray actors)
        trial = subprocess.run(self.command(name, profile, ["/bin/true"]), capture_output=True,
                               timeout=30, stdin=subprocess.DEVNULL)
        self.cgroups.remove(name)
        if trial.returncode != 0:
            return f"bubblewrap cannot make a sandbox here: {trial.stderr.decode(errors='replace')[-300:]}"
        return None

    def command(self, name: str, profile: SandboxProfile, argv: Sequence[str]) -> list[str]:
        """argv inside the sandbox, as one command line for the host; `name` (unique while
        the process lives) names its cgroups, which `release(name)` removes. Every
        sandbox made here (a build, a server, a model replica) first ends the node's
        orphans (`sweep_orphans`)."""
        self.sweep_orphans()
        joins = [f"echo $$ > {shlex.quote(str(p))}" for p in self.cgroups.create(name, profile.limits)]
        inner = [*self._bwrap(profile), "--", *_drop_to(profile.uid), "--",
                 "/usr/bin/env", "--default-signal=TERM", "--", *argv]
        nproc = profile.limits.pids * 4          # per uid where no pids cgroup counts per replica
        launch = shlex.join(["prlimit", f"--nproc={nproc}", "--core=0", "--", *inner])
        # sh stays bwrap's parent, and bwrap dies with it (--die-with-parent), its sandbox
        # with bwrap: a SIGKILL to the PID the pool knows ends it all, while the pool's own
        # death ends nothing (a replica outlives its control plane, to be adopted). sh and
        # bwrap ignore the SIGTERM a stop sends the group; the command (env resets it) gets
        # it and stops gracefully.
        script = " && ".join([*joins, "trap '' TERM",
                              f"{launch} {SECCOMP_FD}< {shlex.quote(str(self.seccomp_path))}"])
        return ["/bin/sh", "-c", script]

    def release(self, name: str) -> None:
        self.cgroups.remove(name)

    def sweep_orphans(self) -> list[str]:
        """Sandboxes whose launcher is gone, ended: their processes killed, their groups
        removed; their names. bwrap dies with the launcher once it armed that, but a
        launcher killed in the moment before (its Ray actor killed as it started it)
        leaves bwrap and the sandbox to init. A launcher is the group's root-owned shell:
        a tenant's processes never run as root, so none can pose as one. Empty groups
        long past their launch go too: one released while its processes were still
        exiting is retried only by the Cgroups that released it, which may be gone."""
        swept = []
        for name in self.cgroups.names():
            members = self.cgroups.members(name)
            if members and not any(_is_launcher(pid) for pid in members):
                self._kill_group(name, members)
                swept.append(name)
            elif not members and self.cgroups.age_s(name) > EMPTY_GROUP_AGE_S:
                self.release(name)
        return swept

    def _kill_group(self, name: str, members: list[int]) -> None:
        """SIGKILL to each, then the group removed once they have left it (at once, as a
        rule: else at a later create or remove, as Cgroups does)."""
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 1.0
        while self.cgroups.members(name) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.release(name)

    def _bwrap(self, profile: SandboxProfile) -> list[str]:
        args = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try",
                "--die-with-parent", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                "--cap-add", "CAP_SETPCAP", "--seccomp", str(SECCOMP_FD),
                "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(profile.tmp_bytes),
                "--tmpfs", "/tmp", "--perms", "1777", "--size", str(profile.tmp_bytes),
                # its own /dev/shm: the replica hands adapters to its engine core through it
                "--tmpfs", "/dev/shm", "--hostname", "sandbox"]
        if not profile.network:
            args.append("--unshare-net")
        args += _system_mounts(profile.network)
        for path in self.platform.paths:
            args += ["--ro-bind-try", str(path), str(path)]
        for bind in profile.binds:
            args += ["--bind" if bind.writable else "--ro-bind", str(bind.source), str(bind.target)]
        for device in profile.devices:
            args += ["--dev-bind", str(device), str(device)]
        return args + _open_parents([*self.platform.paths, *(b.target for b in profile.binds)])


def _system_mounts(network: bool) -> list[str]:
    args = ["--perms", "0755", "--dir", "/etc"]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in (*SYSTEM_FILES, *(NETWORK_FILES if network else ())):
        args += ["--ro-bind-try", path, path]
    return args


def _outermost(paths: set[Path]) -> tuple[Path, ...]:
    """The paths not inside another of them (one bind covers those)."""
    return tuple(sorted(p for p in paths if not any(q in p.parents for q in paths)))


def _open_parents(targets: Sequence[Path]) -> list[str]:
    """bwrap makes the folders above a bind with the host folder's mode; /root is 0700,
    which would hide the interpreter under it from the sandbox's uid. Folders it made
    only: one inside a bind is the bind's own, read-only; /tmp keeps its 1777."""
    parents = {p for path in targets for p in path.parents if p not in (Path("/"), Path("/tmp"))}
    made = [p for p in parents if not any(t == p or t in p.parents for t in targets)]
    return [arg for p in sorted(made) for arg in ("--chmod", "0755", str(p))]


def _drop_to(uid: int) -> list[str]:
    return ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]


def replica_folder(folder: Path, uid: int, secret: str, secret_name: str) -> None:
    """A sandboxed server's own folder, afresh: its uid's alone (0700), holding the secret
    file (0400) the server reads and, later, the unix socket it listens on."""
    shutil.rmtree(folder, ignore_errors=True)
    own_folder(folder, uid, 0o700)
    secret_file = folder / secret_name
    fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "w") as out:
        out.write(secret)
    os.chown(secret_file, uid, uid)


def files_under(folder: Path) -> Iterator[Path]:
    """Every file below `folder` (links too, not followed into folders), in order."""
    for root, _, names in os.walk(folder):
        for name in sorted(names):
            yield Path(root) / name


def own_folder(folder: Path, uid: int, mode: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    os.chown(folder, uid, uid)
    os.chmod(folder, mode)


def sandbox_env(environ: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """What a sandboxed process starts with: a PATH and a locale, its HOME and TMPDIR in
    its own /tmp, and what the caller adds."""
    base = {k: environ[k] for k in ("PATH", "LANG", "LC_ALL", "TZ") if k in environ}
    return {**base, "HOME": "/tmp", "TMPDIR": "/tmp", **extra}
