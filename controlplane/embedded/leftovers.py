"""A server's pid file on a data dir, and what an earlier run left there.

`thawpool up` killed hard (SIGKILL, the OOM killer, a lost session) leaves its Postgres
and SeaweedFS running, or their pid files naming processes long gone. The next start on
that data dir must neither connect to a server it did not start nor kill a process that
is not that server: the PID in the pid file is stopped only when /proc/PID/cmdline shows
that very program serving that very data dir; any other pid file is stale and removed.
The process is held by a pidfd from the check to the signal, so a PID reused in between
is never signalled.
"""
from __future__ import annotations

import logging
import os
import select
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PidFile:
    path: Path
    program: str                   # the executable's file name: "postgres", "weed"
    data_flag: str                 # "-D" (the next argument names the data dir) or "-dir=" (joined)
    data_dir: Path
    stop_signal: signal.Signals    # the program's own clean (fast) shutdown
    grace_s: float = 30.0          # how long that shutdown may take before SIGKILL

    def pid(self) -> Optional[int]:
        try:
            first = self.path.read_text().split(maxsplit=1)
            return int(first[0]) if first else None
        except (OSError, ValueError):
            return None

    def write(self, pid: int) -> None:
        self.path.write_text(f"{pid}\n")

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    def clear_leftover(self, spare: Optional[int] = None, timeout_s: float = 30.0) -> None:
        """Stop the server this pid file names if it is still running (not `spare`, the one
        the caller started itself), or remove the file if it names anything else."""
        pid = self.pid()
        if pid is None and self.path.exists():
            log.warning("removing unreadable pid file %s", self.path)
            self.remove()
        if pid is not None and pid != spare:
            self._stop_or_forget(pid, "left running by an earlier run", timeout_s)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the server this pid file names by its PID (when its own tool failed to)."""
        pid = self.pid()
        if pid is not None:
            self._stop_or_forget(pid, "stopped by its PID", timeout_s)

    def _stop_or_forget(self, pid: int, why: str, timeout_s: float) -> None:
        try:
            handle = os.pidfd_open(pid)
        except ProcessLookupError:
            log.warning("removing stale %s: PID %d has exited", self.path, pid)
            self.remove()
            return
        try:
            if not self.names(pid):
                log.warning("removing stale %s: PID %d is not %s on %s", self.path, pid,
                            self.program, self.data_dir)
            else:
                log.warning("stopping %s (PID %d) on %s: %s", self.program, pid, self.data_dir, why)
                _stop(handle, pid, self.program, self.stop_signal, min(self.grace_s, timeout_s), timeout_s)
        finally:
            os.close(handle)
        self.remove()

    def names(self, pid: int) -> bool:
        """Whether PID runs this program on this data dir (a zombie runs nothing)."""
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            return False
        words = [a.decode(errors="replace") for a in args if a]
        if not words or Path(words[0]).name != self.program:
            return False
        served = _flag_value(words[1:], self.data_flag)
        return served is not None and _same_dir(Path(cwd) / served, self.data_dir)


def _flag_value(words: list[str], flag: str) -> Optional[str]:
    for i, word in enumerate(words):
        if flag.endswith("=") and word.startswith(flag):
            return word[len(flag):]
        if word == flag and i + 1 < len(words):
            return words[i + 1]
    return None


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _stop(handle: int, pid: int, program: str, sig: signal.Signals, grace_s: float, timeout_s: float) -> None:
    if not _signal_and_wait(handle, sig, grace_s):
        log.warning("%s (PID %d) ignored %s: SIGKILL", program, pid, sig.name)
        _signal_and_wait(handle, signal.SIGKILL, timeout_s)


def _signal_and_wait(handle: int, sig: signal.Signals, timeout_s: float) -> bool:
    """True once the process is gone (its pidfd turns readable when it exits)."""
    try:
        signal.pidfd_send_signal(handle, sig)
    except ProcessLookupError:
        return True
    poller = select.poll()
    poller.register(handle, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))
