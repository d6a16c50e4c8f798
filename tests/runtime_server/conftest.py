"""Real `python -m runtime.serve.server` processes over the tiny model, stopped by PID in teardown."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from controlplane.embedded.ports import free_port

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180   # torch import on a busy 2-core machine


@dataclass
class ServerProcess:
    process: subprocess.Popen
    base_url: str
    log_path: Path
    headers: dict[str, str]     # its secret, when it has one (/health says more with it)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_health(self, statuses: set[str], timeout_s: float = START_TIMEOUT_S) -> dict:
        """Poll /health until its status is one of `statuses`; fail with the log otherwise."""
        deadline = time.monotonic() + timeout_s
        body: dict = {}
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"server exited with {self.process.returncode}:\n{self.log()}")
            try:
                body = httpx.get(f"{self.base_url}/health", headers=self.headers, timeout=5).json()
                if body.get("status") in statuses:
                    return body
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        pytest.fail(f"/health never reached {statuses} (last {body}):\n{self.log()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)


def start_server(args: list[str], log_path: Path, env: dict[str, str] | None = None) -> ServerProcess:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1", **(env or {})}
    log = open(log_path, "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "runtime.serve.server", "--host", "127.0.0.1", "--port", str(port), *args],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    secret = env.get("THAWPOOL_REPLICA_SECRET")
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    return ServerProcess(process, f"http://127.0.0.1:{port}", log_path, headers)


# A cache small enough that a long prompt can exceed it, big enough for the tests' batches.
KV_CACHE_TOKENS = 1024
SERVED_NAME = "tiny-llama"


@pytest.fixture(scope="session")
def engine_kwargs() -> dict:
    return {"kv_cache_tokens": KV_CACHE_TOKENS, "block_size": 16}


@pytest.fixture(scope="session")
def server_process(tiny_model, tmp_path_factory, engine_kwargs):
    """One replica shared by the HTTP tests, started as early as possible (it takes a while)."""
    proc = start_server(["--model", str(tiny_model), "--served-model-name", SERVED_NAME,
                         "--kv-cache-tokens", str(engine_kwargs["kv_cache_tokens"]),
                         "--block-size", str(engine_kwargs["block_size"])],
                        tmp_path_factory.mktemp("server") / "server.log")
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def server(server_process):
    server_process.wait_health({"ready"})
    return server_process


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        yield c


@pytest.fixture
def openai_client(server):
    import openai

    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0,
                       timeout=60) as c:
        yield c


STANDBY_SECRET = "test-standby-secret-0123456789"


@pytest.fixture(scope="session")
def standby(tmp_path_factory):
    """A --standby replica with a secret in its environment, as the pool starts one."""
    proc = start_server(["--standby"], tmp_path_factory.mktemp("standby") / "server.log",
                        env={"THAWPOOL_REPLICA_SECRET": STANDBY_SECRET})
    try:
        proc.wait_health({"standby", "loading", "ready", "failed"})
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def standby_client(standby):
    """Calls the standby replica with its secret."""
    with httpx.Client(base_url=standby.base_url, timeout=60,
                      headers={"Authorization": f"Bearer {STANDBY_SECRET}"}) as c:
        yield c


@pytest.fixture(scope="session")
def offline_llm(tiny_model, engine_kwargs, server_process):
    """The same engine in this process, for server-vs-offline equality.

    Asks for `server_process` only so the replica loads while this one does.
    """
    import torch

    torch.set_num_threads(1)
    from runtime import LLM

    return LLM(str(tiny_model), **engine_kwargs)
