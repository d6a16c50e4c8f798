"""Real servers for control-plane tests: the app under uvicorn, runtime replicas."""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import uvicorn

from controlplane.embedded.ports import free_port

REPO = Path(__file__).resolve().parents[3]


@contextlib.asynccontextmanager
async def serve(app, host: str = "127.0.0.1"):
    """Runs `app` under uvicorn in this event loop; yields its base URL."""
    port = free_port(host)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, lifespan="on",
                                           log_level="warning", access_log=False))
    server.install_signal_handlers = lambda: None     # older uvicorn
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("uvicorn exited before it started")
            await asyncio.sleep(0.02)
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


class RuntimeProcess:
    """`python -m runtime.serve.server --model DIR --port N` as a child, stopped by PID."""

    def __init__(self, model_dir: Path, log_path: Path, extra_args: tuple[str, ...] = ()):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        log = open(log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "runtime.serve.server", "--model", str(model_dir),
             "--host", "127.0.0.1", "--port", str(self.port), "--device", "cpu", *extra_args],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        log.close()

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"runtime.serve.server exited: {self.log_path.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"runtime.serve.server not ready: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
