"""Processes of the pool's runtime replicas: own process group, stopped by PID.

A `RuntimeProcess` is one the pool spawned (`RuntimeProcess.spawn`: its child,
whose exit status it reads) or one an earlier pool spawned and this one found
again after a crash (re-adoption): known by its PID and its start time, so a
PID the kernel has since given to another process is never taken for it
(`process_start_ticks`).

stop(): SIGTERM to the process group, then SIGKILL after a timeout.
"""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Mapping, Optional, Sequence


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def process_start_ticks(pid: int) -> Optional[int]:
    """When the process started (clock ticks after boot, /proc/PID/stat field 22); None
    when there is no such process, or it has exited and waits to be reaped (a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()     # after "pid (comm) ": state is field 3
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


class RuntimeProcess:
    def __init__(self, pid: int, started: Optional[int], log_path: Path,
                 popen: Optional[subprocess.Popen[bytes]] = None):
        self.pid = pid
        self.started = started                 # process_start_ticks when it was spawned
        self.log_path = log_path
        self.popen = popen                     # None: not our child (an earlier pool's)

    @classmethod
    def spawn(cls, args: Sequence[str], env: Mapping[str, str], log_path: Path) -> RuntimeProcess:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(list(args), env=dict(env), stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        return cls(popen.pid, process_start_ticks(popen.pid), log_path, popen)

    def is_alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        ticks = process_start_ticks(self.pid)
        return ticks is not None and (self.started is None or ticks == self.started)

    def exit_description(self) -> Optional[str]:
        """How it ended ("exited with code N"), None while it runs."""
        if self.is_alive():
            return None
        if self.popen is None:
            return "exited (started by an earlier pool: exit status unknown)"
        return f"exited with code {self.popen.poll()}"

    def set_nice(self, nice: int) -> None:
        """The scheduling weight of all its group's threads (a standby warming up is
        background work: it yields the CPU to replicas serving calls). Where the kernel
        groups a session's threads for the scheduler (autogroup), a nice weighs only
        within the group, so the group's own nice is set too. Best effort: a process
        that exited keeps nothing to set."""
        try:
            os.setpriority(os.PRIO_PGRP, self.pid, nice)
        except OSError:
            return
        autogroup = Path(f"/proc/{self.pid}/autogroup")
        try:
            autogroup.write_text(str(nice))
        except OSError:
            pass                     # no autogroup on this kernel: the threads' nice is it

    def log_tail(self, limit: int = 600) -> str:
        try:
            return self.log_path.read_bytes()[-limit:].decode("utf-8", "replace").strip()
        except OSError:
            return ""

    async def stop(self, timeout_s: float) -> None:
        if not self.is_alive():
            return
        signal_group(self.pid, signal.SIGTERM)
        if not await self._wait(timeout_s):
            signal_group(self.pid, signal.SIGKILL)
            await self._wait(timeout_s)

    def kill_now(self) -> None:
        """Synchronous last resort (interpreter shutdown, failed start)."""
        if self.is_alive():
            signal_group(self.pid, signal.SIGKILL)
            try:
                if self.popen is not None:
                    self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    async def _wait(self, timeout_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.is_alive():
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True


def signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)          # the group this process leads (start_new_session)
    except ProcessLookupError:
        pass
