"""Memory, process and CPU limits of one sandboxed process tree, by cgroup.

cgroup v2 (current distributions) or v1 (older hosts, these test machines):
a group per sandboxed process under `thawpool/` of each controller; the
process joins before it execs anything (pool/sandbox.py's launcher), so every
child it forks is counted. Where the host gives us neither (no controller
mounted, or not writable), `create` returns no group and the rlimits the
launcher sets still hold (per uid, not per replica).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

PARENT = "thawpool"
V1_CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class CgroupLimits:
    memory_bytes: Optional[int]     # None: no memory limit (a CUDA replica maps far more than it uses)
    pids: int                       # processes and threads
    cpus: Optional[float]           # None: no CPU quota


class Cgroups:
    def __init__(self, root: Path = Path("/sys/fs/cgroup")):
        self.root = root
        self._released: set[str] = set()      # groups whose process was still exiting

    @property
    def version(self) -> Optional[int]:
        if (self.root / "cgroup.controllers").exists():
            return 2
        if (self.root / "memory" / "memory.limit_in_bytes").exists():
            return 1
        return None

    def create(self, name: str, limits: CgroupLimits) -> list[Path]:
        """The groups' `cgroup.procs` files the process writes its PID to; [] where the
        host lets us make none. A CPU group only with a quota to enforce: a group's
        threads share one scheduling weight, which under load would give a sandboxed
        replica less CPU than the same process outside one."""
        self._remove_released()
        try:
            if self.version == 2:
                return [self._create_v2(name, limits)]
            if self.version == 1:
                return self._create_v1(name, limits)
        except OSError:
            self.remove(name)
        return []

    def limit_memory(self, name: str, memory_bytes: int) -> bool:
        """A running group's memory limit, now that its use is known (a standby's at its
        load); False where the host gave it no memory group or refused the limit."""
        files = {2: [self.root / PARENT / name / "memory.max"],
                 1: [self.root / "memory" / PARENT / name / "memory.limit_in_bytes"]}.get(self.version or 0, [])
        try:
            for path in files:
                _write(path, str(memory_bytes))
        except OSError:
            return False
        return bool(files)

    def names(self) -> list[str]:
        """The groups made here (by any pool of this host), by name."""
        parents = [self.root / PARENT] if self.version == 2 else \
            [self.root / c / PARENT for c in V1_CONTROLLERS] if self.version == 1 else []
        return sorted({g.name for p in parents if p.is_dir() for g in p.iterdir() if g.is_dir()})

    def members(self, name: str) -> list[int]:
        """The PIDs in the group (every controller's group holds the same ones)."""
        for folder in self._folders(name):
            try:
                return [int(pid) for pid in (folder / "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                continue
        return []

    def age_s(self, name: str) -> float:
        """Seconds since the group was made (0 where it is not there)."""
        for folder in self._folders(name):
            try:
                return max(0.0, time.time() - folder.stat().st_ctime)
            except OSError:
                continue
        return 0.0

    def remove(self, name: str) -> None:
        """The process's groups, once it has exited. A sandbox's inner processes die a
        moment after the one the pool waited for, and a group with a process in it
        cannot go: such a group is removed again at the next create or remove."""
        self._released.add(name)
        self._remove_released()

    def _remove_released(self) -> None:
        for name in list(self._released):
            if all(_rmdir(folder) for folder in self._folders(name)):
                self._released.discard(name)

    def _folders(self, name: str) -> list[Path]:
        if self.version == 2:
            return [self.root / PARENT / name]
        return [self.root / c / PARENT / name for c in V1_CONTROLLERS]

    def _create_v2(self, name: str, limits: CgroupLimits) -> Path:
        parent = self.root / PARENT
        parent.mkdir(exist_ok=True)
        wanted = {"memory", "pids", *(["cpu"] if limits.cpus is not None else [])} \
            & set((self.root / "cgroup.controllers").read_text().split())
        for folder in (self.root, parent):
            (folder / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(wanted)))
        group = parent / name
        group.mkdir(exist_ok=True)
        _write(group / "pids.max", str(limits.pids))
        if limits.memory_bytes is not None:
            _write(group / "memory.max", str(limits.memory_bytes))
            if (group / "memory.swap.max").exists():     # absent where swap is not accounted
                _write(group / "memory.swap.max", "0")
        if limits.cpus is not None:
            _write(group / "cpu.max", f"{int(limits.cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}")
        return group / "cgroup.procs"

    def _create_v1(self, name: str, limits: CgroupLimits) -> list[Path]:
        groups = []
        for controller in V1_CONTROLLERS:
            if not (self.root / controller).is_dir() or (controller == "cpu" and limits.cpus is None):
                continue
            group = self.root / controller / PARENT / name
            group.mkdir(parents=True, exist_ok=True)
            groups.append(group)
            if controller == "pids":
                _write(group / "pids.max", str(limits.pids))
            elif controller == "memory" and limits.memory_bytes is not None:
                _write(group / "memory.limit_in_bytes", str(limits.memory_bytes))
            elif controller == "cpu" and limits.cpus is not None:
                _write(group / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(group / "cpu.cfs_quota_us", str(int(limits.cpus * CPU_PERIOD_US)))
        return [g / "cgroup.procs" for g in groups]


def _rmdir(folder: Path) -> bool:
    """True once the folder is gone."""
    try:
        folder.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def _write(path: Path, value: str) -> None:
    if not path.exists():
        raise OSError(f"{path}: no such cgroup file")
    path.write_text(value)
