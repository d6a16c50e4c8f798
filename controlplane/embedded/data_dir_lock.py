"""One `thawpool up` per data dir.

The embedded servers under a data dir belong to the `up` that holds its lock
(`<data dir>/up.lock`, an flock the kernel releases when that process ends, however it
ends). Only the holder may take a Postgres or SeaweedFS running there for a leftover of
an earlier run and stop it; a second `up` on the same data dir is refused instead.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO, Optional


class DataDirInUse(RuntimeError):
    pass


class DataDirLock:
    def __init__(self, data_dir: Path):
        self.path = data_dir / "up.lock"
        self._handle: Optional[IO[str]] = None

    def take(self) -> None:
        """DataDirInUse while another live process holds it; held already: nothing to do."""
        if self._handle is not None:
            return
        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise DataDirInUse(f"the data dir {self.path.parent} is in use by another "
                               f"thawpool up (PID {holder})") from None
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._handle = handle

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()        # closing the file releases the flock
            self._handle = None
