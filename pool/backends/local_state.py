"""The local backend's registry of live runtime processes, in the pool's state dir.

One JSON file per process (`<pid>.json`, mode 0600 in a 0700 folder: a
replica's record holds its secret), written when the process is spawned,
rewritten with its `ReplicaRecord` once it serves a replica, removed when it
stops. A control plane that dies without stopping its processes leaves these
files behind, and the next pool on the same state dir finds its replicas
through them. A pool holds the folder's lock while it runs, so two pools never
share (and stop each other's) replicas; the kernel releases the lock of a
process that dies.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Optional

from pool.adoption import ReplicaRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProcessEntry:
    pid: int
    started: Optional[int]                  # pool.processes.process_start_ticks at spawn
    port: int
    log_path: Path
    replica: Optional[ReplicaRecord] = None  # None: a warm standby, serving nobody yet
    egress: tuple[str, ...] = ()             # the hosts its proxy lets it reach (a function's grant)

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "started": self.started, "port": self.port, "log_path": str(self.log_path),
                "replica": self.replica.to_json() if self.replica else None, "egress": list(self.egress)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessEntry:
        try:
            replica = ReplicaRecord.from_json(data["replica"]) if data.get("replica") else None
            egress = tuple(str(host) for host in data.get("egress", ()))
            return cls(int(data["pid"]), data.get("started"), int(data["port"]), Path(data["log_path"]), replica,
                       egress)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a process entry: {exc}") from None


class ProcessRegistry:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._lock: Optional[IO[str]] = None

    def lock(self) -> None:
        """Take the folder for this pool; RuntimeError while another live pool holds it."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        handle = open(self.folder / ".lock", "a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise RuntimeError(f"another pool is running on the state dir {self.folder}") from None
        self._lock = handle

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()          # closing the file releases the flock
            self._lock = None

    def entries(self) -> list[ProcessEntry]:
        """Every registered process; an unreadable file is logged and removed."""
        found = []
        for path in sorted(self.folder.glob("*.json")):
            try:
                found.append(ProcessEntry.from_json(json.loads(path.read_text())))
            except (OSError, ValueError) as exc:
                log.warning("dropping unreadable process record %s: %s", path, exc)
                path.unlink(missing_ok=True)
        return found

    def write(self, entry: ProcessEntry) -> None:
        """Write (or replace) the entry of entry.pid, atomically, readable by its owner only."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.folder / f"{entry.pid}.json"
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(entry.to_json(), out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)

    def remove(self, pid: int) -> None:
        (self.folder / f"{pid}.json").unlink(missing_ok=True)
