"""Whether the pool of a `thawpool up` has a warm standby up, seen from outside.

The local backend registers every runtime process it spawns (pool/backends/local_state.py);
a standby is one that serves no replica yet. Its readiness is not published, but its
start is torch imported at a low CPU weight: a standby whose process tree has used
(almost) no CPU for QUIET_S has finished it and waits for a load. On a busy machine a
standby still warming gets a tenth of a core or so (nice 10), far above QUIET_CPU_S.
"""
from __future__ import annotations

import time

from benchmarks.cpu_time import tree_cpu_s
from tests.faults.stack import FaultStack, alive

QUIET_S = 2.0
QUIET_CPU_S = 0.03


def standby_ready(stack: FaultStack) -> bool:
    assert stack.plane is not None
    standbys = [pid for pid, replica in stack.plane.replica_pids().items() if replica is None and alive(pid)]
    if not standbys:
        return False
    before = {pid: tree_cpu_s(pid) for pid in standbys}
    time.sleep(QUIET_S)
    return any(0.0 <= tree_cpu_s(pid) - used < QUIET_CPU_S for pid, used in before.items() if alive(pid))
