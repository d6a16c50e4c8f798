"""Child processes of the pool: own process group, stopped by PID.

stop(): SIGTERM to the child's process group, then SIGKILL after a timeout.
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


class ManagedProcess:
    def __init__(self, args: Sequence[str], env: Mapping[str, str], log_path: Path):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(list(args), env=dict(env), stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = self.popen.pid

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self) -> Optional[int]:
        return self.popen.poll()

    def log_tail(self, limit: int = 600) -> str:
        try:
            return self.log_path.read_bytes()[-limit:].decode("utf-8", "replace").strip()
        except OSError:
            return ""

    async def stop(self, timeout_s: float) -> None:
        if not self.is_alive():
            return
        self._signal(signal.SIGTERM)
        if not await self._wait(timeout_s):
            self._signal(signal.SIGKILL)
            await self._wait(timeout_s)

    def kill_now(self) -> None:
        """Synchronous last resort (interpreter shutdown, failed start)."""
        if self.is_alive():
            self._signal(signal.SIGKILL)
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)          # the group this child leads (start_new_session)
        except ProcessLookupError:
            pass

    async def _wait(self, timeout_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.is_alive():
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True
