"""CPU time from /proc: of a process tree, and of the whole machine, to tell how busy a run
left the cores (this machine runs other work too)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def tree_cpu_s(pid: int) -> float:
    """User and system CPU seconds of a process and all its descendants (a sandbox nests
    them), with those of the children they have reaped."""
    parents: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        child = int(entry.name)
        parents.setdefault(int(fields[1]), []).append(child)
        times[child] = sum(int(f) for f in fields[11:15]) / tick     # utime stime cutime cstime
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += times.get(current, 0.0)
        todo += parents.get(current, [])
    return total


@dataclass(frozen=True)
class MachineCpu:
    busy_s: float                    # CPU seconds spent on anything, all cores together
    total_s: float                   # CPU seconds the cores had

    def since(self, earlier: "MachineCpu") -> "MachineCpu":
        return MachineCpu(self.busy_s - earlier.busy_s, self.total_s - earlier.total_s)


def machine_cpu() -> MachineCpu:
    """From the first line of /proc/stat: idle and iowait are not busy."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = values[3] + values[4]
    return MachineCpu((sum(values[:8]) - idle) / tick, sum(values[:8]) / tick)
