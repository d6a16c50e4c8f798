"""A Postgres of a test's own to stop, start, freeze (SIGSTOP: a blackholed database
that accepts connections and never answers) and thaw; the session one stays up."""
from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Iterator

from controlplane.embedded import EmbeddedPostgres


def postgres_pids(data_dir: Path) -> list[int]:
    """The postmaster (first line of postmaster.pid) and every process it forked."""
    postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == postmaster:
            children.append(int(entry.name))
    return [postmaster, *children]


@contextlib.contextmanager
def frozen(pg: EmbeddedPostgres) -> Iterator[None]:
    """Every process of `pg` stopped (SIGSTOP) inside the block, continued after it."""
    pids = postgres_pids(pg.data_dir)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
