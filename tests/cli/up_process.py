"""`thawpool up` as its own process with everything embedded (its own Postgres and its own
SeaweedFS under its data dir), signalled as systemd or a terminal signals it: to its PID
only, never its group, so whatever stops its children is `up`'s own shutdown."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional

from controlplane.embedded.ports import free_port
from pool.processes import process_start_ticks
from tests.controlplane.test_cli import wait_banner

REPO = Path(__file__).resolve().parents[2]


def embedded_env(**extra: str) -> dict[str, str]:
    """This environment less anything that points `up` at an external Postgres or S3."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("THAWPOOL_", "AWS_")) and k != "RAY_ADDRESS"}
    return {**env, "PYTHONUNBUFFERED": "1", "THAWPOOL_RUNTIME_THREADS": "1", **extra}


class UpProcess:
    def __init__(self, work: Path, env: Mapping[str, str], *flags: str, data_dir: Optional[Path] = None):
        work.mkdir(parents=True, exist_ok=True)
        self.data_dir, self.log_path, self.port = data_dir or work / "data", work / "up.log", free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "controlplane.cli.main", "up", "--data-dir", str(self.data_dir),
                 "--port", str(self.port), *flags], cwd=REPO, env=dict(env), stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)

    def wait_banner(self, timeout_s: float = 240) -> str:
        return wait_banner(self.process, self.log_path, timeout_s)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def admin_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {(self.data_dir / 'admin-key').read_text().strip()}"}

    def s3_endpoint(self) -> str:
        found = re.search(r"thawpool: s3\s+(\S+)", self.log())
        assert found, self.log()[-2000:]
        return found.group(1)

    def postgres_pid(self) -> int:
        return int((self.data_dir / "postgres" / "postmaster.pid").read_text().split()[0])

    def weed_pid(self) -> int:
        return int((self.data_dir / "s3" / "weed.pid").read_text().split()[0])

    def signal(self, sig: int) -> None:
        os.kill(self.process.pid, sig)

    def wait(self, timeout_s: float) -> Optional[int]:
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill_group(self) -> None:
        """The test's own cleanup when `up` failed to stop: its group, then what it left."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


def wait_gone(pids: Iterable[int], timeout_s: float) -> list[int]:
    """The PIDs still alive after timeout_s (zombies count as gone)."""
    pending = list(pids)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        pending = [pid for pid in pending if process_start_ticks(pid) is not None]
        time.sleep(0.2)
    return [pid for pid in pending if process_start_ticks(pid) is not None]


def eventually(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.2)
    return predicate()


def processes_naming(path: Path) -> list[int]:
    """PIDs whose command line names path (a data dir's Postgres, weed or replica)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(path) in args and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return found


def kill_left(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
