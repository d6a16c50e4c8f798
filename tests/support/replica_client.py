"""An httpx client that reaches a replica by its base URL: a TCP address, or the unix
socket of a sandboxed replica (`http+unix://`, wire/replica_address.py)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from pool.replica_http import ReplicaTransport

TEST_ANSWER_BYTES = 64 << 20      # tests read whole metrics pages and long streams


def replica_http(**kwargs: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=ReplicaTransport(TEST_ANSWER_BYTES), **kwargs)


def host_pid(ns_pid: int, group: int) -> int:
    """The host's PID of the process that a sandboxed replica (its own PID namespace)
    reports as `ns_pid`; `group` is the replica's process group (its handle's pid)."""
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
            if os.getpgid(int(status.parent.name)) != group:
                continue
        except (OSError, ValueError):
            continue
        if int(fields.get("NSpid", "0").split()[-1]) == ns_pid:
            return int(status.parent.name)
    raise LookupError(f"no process of group {group} is {ns_pid} in its namespace")
