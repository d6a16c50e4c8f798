"""Progress of an upload: a bar per file and one overall on a terminal, a line per part
otherwise (logs and CI see every step; nothing waits silently)."""
from __future__ import annotations

import sys
import threading
from typing import Protocol

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, Progress, TaskID, TextColumn,
                           TimeRemainingColumn, TransferSpeedColumn)


class UploadProgress(Protocol):
    def add_file(self, path: str, size: int, done: int) -> None: ...
    def advance(self, path: str, nbytes: int, label: str) -> None: ...
    def close(self) -> None: ...


def upload_progress(total: int, done: int) -> UploadProgress:
    if sys.stderr.isatty():
        return BarProgress(total, done)
    return LineProgress(total, done)


class BarProgress:
    def __init__(self, total: int, done: int):
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                 TransferSpeedColumn(), TimeRemainingColumn(),
                                 console=Console(stderr=True))
        self.overall = self.progress.add_task("total", total=total, completed=done)
        self.files: dict[str, TaskID] = {}
        self.progress.start()

    def add_file(self, path: str, size: int, done: int) -> None:
        self.files[path] = self.progress.add_task(f"  {path}", total=size, completed=done)

    def advance(self, path: str, nbytes: int, label: str) -> None:
        self.progress.advance(self.files[path], nbytes)
        self.progress.advance(self.overall, nbytes)

    def close(self) -> None:
        self.progress.stop()


class LineProgress:
    def __init__(self, total: int, done: int):
        self.total, self.done = total, done
        self.lock = threading.Lock()

    def add_file(self, path: str, size: int, done: int) -> None:
        pass

    def advance(self, path: str, nbytes: int, label: str) -> None:
        with self.lock:
            self.done += nbytes
            percent = 100.0 * self.done / self.total if self.total else 100.0
            print(f"push: {path} {label} uploaded ({_mib(self.done)}/{_mib(self.total)} MiB, "
                  f"{percent:.0f}%)", file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


def _mib(nbytes: int) -> str:
    return f"{nbytes / 1024 ** 2:.1f}"
