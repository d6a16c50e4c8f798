"""The pool's cold-start record carries the replica's own load stages, read from the
/health of a real runtime.serve.server when it answers ready."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping, Optional

import httpx

from controlplane.embedded.ports import free_port
from pool.cold_start import cold_start_timings
from pool.health import wait_healthy
from pool.replica import Replica, ReplicaState
from wire.replica_control import Health

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_the_record_keeps_the_replicas_stages():
    r = Replica("r", "rev", 10.0, T0)
    for t, state in [(10.5, ReplicaState.PULLING), (13.0, ReplicaState.LOADING), (14.0, ReplicaState.READY)]:
        r.move(state, t, T0)
    r.load_stages = {"weights_s": 0.25, "pack_s": 0.5, "total_s": 0.9}
    cs = cold_start_timings(r, queue_s=4.2)
    assert (cs.load_s, dict(cs.load_stages)) == (1.0, {"weights_s": 0.25, "pack_s": 0.5, "total_s": 0.9})
    assert cold_start_timings(Replica("s", "rev", 1.0, T0), queue_s=0.0).load_stages == {}


def test_only_numbers_are_taken_from_health():
    body = {"status": "ready", "load_timings": {"weights_s": 1, "weights_gbps": 2.5, "note": "x",
                                                "flag": True}}
    assert Health.parse(body).load_timings == {"weights_s": 1.0, "weights_gbps": 2.5}
    assert Health.parse({"status": "ready"}).load_timings == {}
    assert Health.parse({"status": "ready", "load_timings": ["weights_s"]}).load_timings == {}


class ProcessHandle:
    """The ReplicaHandle of a runtime.serve.server this test started (the protocol, whole)."""

    def __init__(self, process: subprocess.Popen, base_url: str):
        self.replica_id, self.base_url, self.process = "r1", base_url, process
        self.env_s = 0.0
        self.adapter_inbox: Optional[Path] = None

    @property
    def headers(self) -> Mapping[str, str]:
        return {}

    def is_alive(self) -> bool:
        return self.process.poll() is None

    def exit_reason(self) -> Optional[str]:
        code = self.process.poll()
        return None if code is None else f"exited with {code}"

    async def stop(self, timeout_s: float) -> None:
        self.process.terminate()
        await asyncio.to_thread(self.process.wait, timeout_s)


def test_a_fresh_replica_reports_every_stage_of_its_load(tiny_model, tmp_path):
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    with open(tmp_path / "server.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "runtime.serve.server", "--host", "127.0.0.1", "--port", str(port),
             "--model", str(tiny_model), "--kv-cache-tokens", "256"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    handle = ProcessHandle(process, f"http://127.0.0.1:{port}")

    async def ready() -> Health:
        async with httpx.AsyncClient() as http:
            return await asyncio.wait_for(wait_healthy(handle, http, 0.2), 180)
    try:
        stages = asyncio.run(ready()).load_timings
    finally:
        process.terminate()
        process.wait(timeout=30)
    # a process started for this load: its start and its imports are stages of the load
    assert stages["process_s"] > 0 and stages["import_s"] > 0
    assert {"kernels_s", "config_s", "weights_s", "assemble_s", "pack_s", "kv_cache_s",
            "other_s", "weights_gbps"} <= set(stages)
    assert sum(v for k, v in stages.items() if k.endswith("_s") and k != "total_s") \
        >= stages["total_s"] - 1e-3
