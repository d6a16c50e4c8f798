"""The whole platform as separate real processes, each of which a fault test can break:
a Postgres and a SeaweedFS S3 of the suite's own, and the control plane as `thawpool up`
pointed at them (it runs the pool and starts real runtime replicas).

Everything is on loopback with free ports; the S3 port and the control plane's port and
data dir stay the same across restarts, as they would on a real host. `close` stops what
this module started, by PID, including replicas a killed control plane left behind.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import asyncpg
import httpx

from controlplane.embedded import EmbeddedPostgres, EmbeddedS3
from controlplane.embedded.ports import free_port
from tests.controlplane.support.postgres import postgres_pids
from tests.controlplane.support.servers import REPO

HEARTBEAT_S = 2.0            # the pool's heartbeat: GPU time is checked to within one
ACQUIRE_TIMEOUT_S = 45.0     # a cold start on a busy 2-core machine fits in it
MODELS_BUCKET = "thawpool-models"
CATALOGUE = f"s3://{MODELS_BUCKET}/catalogue/"

# `thawpool up` reads its settings from the environment (controlplane/settings.py,
# pool/settings.py): short database timeouts and a fast pool loop, so that faults show
# within seconds; one thread per replica on a 2-core machine; a warm standby process,
# so that each test's cold start loads a tiny model instead of importing torch.
PLANE_ENV = {
    "THAWPOOL_HEARTBEAT_S": str(HEARTBEAT_S), "THAWPOOL_TICK_S": "0.2",
    "THAWPOOL_DESIRED_REFRESH_S": "0.5", "THAWPOOL_SCALE_DOWN_DELAY_S": "1",
    "THAWPOOL_WARM_POOL_SIZE": "1", "THAWPOOL_RUNTIME_THREADS": "1",
    "THAWPOOL_KV_CACHE_TOKENS_DEFAULT": "1024", "THAWPOOL_CRASH_BACKOFF_BASE_S": "0.5",
    "THAWPOOL_CRASH_BACKOFF_CAP_S": "2", "THAWPOOL_S3_ATTEMPTS": "2",
    "THAWPOOL_S3_READ_TIMEOUT_S": "5", "THAWPOOL_EVENT_RETRY_CAP_S": "1",
    "THAWPOOL_DB_CONNECT_TIMEOUT_S": "1", "THAWPOOL_DB_STATEMENT_TIMEOUT_S": "2",
    "THAWPOOL_DB_POOL_TIMEOUT_S": "1", "THAWPOOL_ACQUIRE_TIMEOUT_S": str(ACQUIRE_TIMEOUT_S),
    "THAWPOOL_USAGE_BUFFER_MAX": "16", "THAWPOOL_METRICS_TOKEN": "fault-suite-metrics",
    "THAWPOOL_REQUESTS_PER_MIN": "100000", "THAWPOOL_TOKENS_PER_MIN": "100000000",
    "THAWPOOL_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
}


class ControlPlaneProcess:
    """`python -m controlplane.cli.main up` on a fixed data dir and port, to start, SIGKILL and
    start again; `env` adds or overrides settings."""

    def __init__(self, data_dir: Path, database_url: str, s3: EmbeddedS3, cpu_slots: int,
                 env: Optional[dict[str, str]] = None):
        self.data_dir, self.database_url, self.s3 = data_dir, database_url, s3
        self.cpu_slots = cpu_slots
        self.env = {**PLANE_ENV, **(env or {})}
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.process: Optional[subprocess.Popen[bytes]] = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"plane-{self.starts}.log"

    @property
    def admin_key(self) -> str:
        return (self.data_dir / "admin-key").read_text().strip()

    @property
    def state_dir(self) -> Path:
        """Where the local backend registers its replica processes (pool/backends/local_state.py)."""
        return self.data_dir / "cache" / "state" / "local"

    def start(self, timeout_s: float = 180.0) -> None:
        self.starts += 1
        env = {**os.environ, **self.s3.env(), **self.env}
        env.pop("THAWPOOL_DATABASE_URL", None)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "controlplane.cli.main", "up", "--data-dir", str(self.data_dir),
                 "--port", str(self.port), "--database-url", self.database_url,
                 "--s3-endpoint", self.s3.endpoint, "--cpu-slots", str(self.cpu_slots),
                 "--slot-memory-gb", "2"],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)
        self._wait_ready(timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"thawpool up exited: {self.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/readyz", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise AssertionError(f"thawpool up not ready in {timeout_s:g} s: {self.tail()}")

    def kill(self) -> None:
        """SIGKILL, as the OOM killer would: no cleanup, replicas keep running."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        """A clean stop (SIGTERM): the pool drains and stops its replicas."""
        if self.process is None or self.process.poll() is not None:
            return
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()

    def replica_pids(self) -> dict[int, Optional[str]]:
        """Registered runtime processes: pid -> the replica id it serves (None: not yet)."""
        found: dict[int, Optional[str]] = {}
        for path in self.state_dir.glob("*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                entry = json.loads(path.read_text())
                found[int(entry["pid"])] = (entry.get("replica") or {}).get("replica_id")
        return found

    def metric(self, name: str) -> float:
        """One platform series from /metrics (the sum over its labels)."""
        response = httpx.get(f"{self.base_url}/metrics", timeout=10,
                             headers={"authorization": f"Bearer {self.env['THAWPOOL_METRICS_TOKEN']}"})
        assert response.status_code == 200, response.text
        return sum(float(line.rsplit(" ", 1)[1]) for line in response.text.splitlines()
                   if line.startswith(name) and line[len(name):len(name) + 1] in (" ", "{"))

    @property
    def outbox_path(self) -> Path:
        return self.data_dir / "usage-outbox.jsonl"

    def outbox_records(self) -> int:
        return self.outbox_path.read_bytes().count(b"\n") if self.outbox_path.exists() else 0

    def tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


class FaultStack:
    """Postgres, S3 and the control plane of one fault test, each to break and mend."""

    def __init__(self, root: Path, cpu_slots: int = 2, env: Optional[dict[str, str]] = None):
        self.root = root
        self.pg = EmbeddedPostgres(root / "pg")
        self.s3 = EmbeddedS3(root / "s3")
        self.cpu_slots, self.env = cpu_slots, env
        self.plane: Optional[ControlPlaneProcess] = None
        self._seen_pids: set[int] = set()

    def start(self) -> "FaultStack":
        self.pg.start()
        self.s3.start()
        self.s3.ensure_bucket(MODELS_BUCKET)
        self.plane = ControlPlaneProcess(self.root / "data", self.pg.url, self.s3, self.cpu_slots, self.env)
        self.plane.start()
        self.admin("POST", "/v1/model-sources", {"prefix": CATALOGUE})
        return self

    # ------------------------------------------------------------- faults

    def kill_postgres(self) -> None:
        """SIGKILL the postmaster and every backend (a crash, not a shutdown)."""
        pids = postgres_pids(self.pg.data_dir)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _wait_gone(pids)
        # A killed postmaster may stay a zombie here (PID 1 of a container need not reap
        # it), and both pgserver and Postgres take a lock file naming a zombie for a live
        # server; on a host, init reaps it and Postgres overwrites the stale files itself.
        for lock in [self.pg.data_dir / "postmaster.pid", *self.pg.data_dir.glob(".s.PGSQL.*.lock")]:
            lock.unlink(missing_ok=True)

    def start_postgres(self, timeout_s: float = 60.0) -> None:
        """Start it again and wait until it answers (after a SIGKILL it replays its WAL first)."""
        self.pg.start()
        deadline = time.monotonic() + timeout_s
        while not _answers(self.pg.libpq_uri):
            if time.monotonic() >= deadline:
                raise AssertionError(f"postgres does not answer {timeout_s:g} s after its start")
            time.sleep(0.1)

    def stop_s3(self) -> None:
        self.s3.stop()

    def start_s3(self, timeout_s: float = 60.0) -> None:
        """Start it again (same data dir and port: the endpoint does not change) and wait
        until it serves objects: its filer answers listings before its volumes are back."""
        self.s3.start()
        deadline = time.monotonic() + timeout_s
        while not _serves_objects(self.s3):
            if time.monotonic() >= deadline:
                raise AssertionError(f"S3 serves no object {timeout_s:g} s after its start")
            time.sleep(0.2)

    def mend(self) -> None:
        """Whatever a test broke and did not mend (it failed midway), started again."""
        if not _answers(self.pg.libpq_uri):
            self.start_postgres()
        if self.s3.process is None or self.s3.process.poll() is not None:
            self.start_s3()
        assert self.plane is not None
        if self.plane.process is None or self.plane.process.poll() is not None:
            self.remember_replicas()
            self.plane.start()

    # ------------------------------------------------------------- admin

    @property
    def base_url(self) -> str:
        assert self.plane is not None
        return self.plane.base_url

    def admin(self, method: str, path: str, body: Optional[dict] = None) -> dict:
        assert self.plane is not None
        response = httpx.request(method, f"{self.base_url}{path}", json=body, timeout=60,
                                 headers={"authorization": f"Bearer {self.plane.admin_key}"})
        assert response.status_code < 300 or response.status_code == 409, response.text
        return response.json() if response.content else {}

    def tenant_key(self, tenant: str) -> str:
        self.admin("POST", "/v1/tenants", {"name": tenant})
        body = self.admin("POST", f"/v1/tenants/{tenant}/keys",
                          {"scopes": ["invoke", "deploy", "billing:read"]})
        return str(body["key"])

    def upload(self, model_dir: Path, name: str) -> str:
        from tests.support.model_factory import upload_model

        return upload_model(model_dir, self.s3.client(), MODELS_BUCKET, f"catalogue/{name}")

    def deploy(self, key: str, name: str, model_uri: str, max_replicas: int = 1,
               target_concurrency: int = 64) -> dict:
        response = self.try_deploy(key, name, model_uri, max_replicas, target_concurrency)
        assert response.status_code == 201, response.text
        return dict(response.json())

    def try_deploy(self, key: str, name: str, model_uri: str, max_replicas: int = 1,
                   target_concurrency: int = 64) -> httpx.Response:
        return httpx.post(f"{self.base_url}/v1/deployments", timeout=60,
                          headers={"authorization": f"Bearer {key}"}, json={
            "name": name, "model_uri": model_uri, "resources": {"gpu_memory_gb": 0.5},
            "scaling": {"min_replicas": 0, "max_replicas": max_replicas,
                        "target_concurrency": target_concurrency, "idle_timeout_s": 600},
            "engine": {"kv_cache_tokens": 1024}})

    def undeploy(self, key: str, name: str) -> None:
        response = httpx.delete(f"{self.base_url}/v1/deployments/{name}", timeout=60,
                                headers={"authorization": f"Bearer {key}"})
        assert response.status_code in (200, 204), response.text

    # ------------------------------------------------------------- cleanup

    def remember_replicas(self) -> None:
        """Note the replica processes now registered, so close() can stop them whatever
        happened to the control plane that started them."""
        if self.plane is not None:
            self._seen_pids |= set(self.plane.replica_pids())

    def close(self) -> None:
        self.remember_replicas()
        with contextlib.suppress(Exception):
            self.pg.start()          # a clean stop of the plane records its replicas' stops
        if self.plane is not None:
            self.plane.stop()
            self.remember_replicas()
        for pid in self._seen_pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)   # each runtime leads its own session
        for service in (self.s3, self.pg):
            with contextlib.suppress(Exception):
                service.stop()


def _answers(libpq_uri: str) -> bool:
    async def select_one() -> None:
        conn = await asyncpg.connect(libpq_uri, timeout=2)
        try:
            await conn.fetchval("SELECT 1")
        finally:
            await conn.close()
    try:
        asyncio.run(select_one())
        return True
    except (OSError, asyncpg.PostgresError, asyncio.TimeoutError):
        return False


def _serves_objects(s3: EmbeddedS3) -> bool:
    client = s3.client()
    try:
        for found in client.list_objects_v2(Bucket=MODELS_BUCKET).get("Contents", [])[:1]:
            client.get_object(Bucket=MODELS_BUCKET, Key=found["Key"])["Body"].read()
        return True
    except Exception:  # noqa: BLE001 - any S3 error: not back yet
        return False


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pids: list[int], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while any(alive(pid) for pid in pids):
        if time.monotonic() >= deadline:
            raise AssertionError(f"processes still alive after SIGKILL: {[p for p in pids if alive(p)]}")
        time.sleep(0.05)
