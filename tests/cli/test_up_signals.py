"""`thawpool up` on the local backend stops all it started when signalled: SIGTERM (systemd,
`kill`) and SIGINT (Ctrl-C), sent to its PID only. Its replica processes (a warm standby,
registered in the pool's state dir), its Postgres and its SeaweedFS are gone by PID, the
log shows the shutdown ran, and it exits 0."""
from __future__ import annotations

import json
import signal
import socket
import time

import httpx
import pytest

from tests.cli.up_process import (UpProcess, embedded_env, eventually, kill_left, processes_naming,
                                  wait_gone)

pytestmark = pytest.mark.timeout(300)


def registered(up: UpProcess) -> list[int]:
    """The runtime processes the local backend has registered in its state dir; its close()
    unregisters each one it stops."""
    return [json.loads(f.read_text())["pid"] for f in (up.data_dir / "cache" / "state" / "local").glob("*.json")]


def replica_pids(up: UpProcess, timeout_s: float = 120) -> list[int]:
    """The pool's runtime processes (its warm standby), once there is one."""
    deadline = time.monotonic() + timeout_s
    while not registered(up) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert registered(up), "no replica process registered"
    return registered(up)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_replicas_postgres_and_s3(tmp_path, sig):
    up = UpProcess(tmp_path, embedded_env(THAWPOOL_WARM_POOL_SIZE="1"), "--cpu-slots", "1")
    try:
        up.wait_banner()
        assert httpx.get(f"{up.base_url}/readyz").status_code == 200
        children = {"postgres": up.postgres_pid(), "weed": up.weed_pid(), "replica": replica_pids(up)[0]}
        up.signal(sig)
        code = up.wait(90)
        left = wait_gone(children.values(), 10)
        assert code == 0, up.log()[-3000:]
        assert left == [], ({name: pid for name, pid in children.items() if pid in left}, up.log()[-3000:])
        assert processes_naming(up.data_dir) == [] and registered(up) == []
        log = up.log()
        assert f"thawpool: {sig.name} received, stopping" in log and "thawpool: stopped" in log
    finally:
        up.kill_group()
        kill_left(processes_naming(up.data_dir))


@pytest.mark.parametrize("grace, second", [("2", False), ("120", True)], ids=["grace", "second-signal"])
def test_a_stalled_request_does_not_hold_the_stop(tmp_path, grace, second):
    """A client that never sends the rest of its body holds a request open: the stop waits
    for it at most --stop-grace, or until a second signal, then goes on with the pool's
    close (else systemd's SIGKILL, 90 s later, would end `up` with all still running)."""
    up = UpProcess(tmp_path, embedded_env(THAWPOOL_WARM_POOL_SIZE="1"), "--cpu-slots", "1",
                   "--stop-grace", grace)
    try:
        up.wait_banner()
        children = [up.postgres_pid(), up.weed_pid(), *replica_pids(up)]
        key = up.admin_headers()["authorization"].encode()
        with socket.create_connection(("127.0.0.1", up.port)) as stalled:
            stalled.sendall(b"POST /v1/tenants HTTP/1.1\r\nhost: up\r\nauthorization: " + key +
                            b"\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{")
            time.sleep(1)
            up.signal(signal.SIGTERM)
            if second:
                assert eventually(lambda: "SIGTERM received, stopping" in up.log(), 30), up.log()[-3000:]
                time.sleep(1)
                up.signal(signal.SIGTERM)
            code = up.wait(60)
        assert code == 0, up.log()[-3000:]
        assert wait_gone(children, 10) == [] and processes_naming(up.data_dir) == []
        assert registered(up) == [], "the pool's close ran"
        assert ("SIGTERM received again; cutting requests short" in up.log()) == second
    finally:
        up.kill_group()
        kill_left(processes_naming(up.data_dir))
