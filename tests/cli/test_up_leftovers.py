"""A start on a data dir finds what an earlier run left there.

A `thawpool up` killed hard leaves its Postgres and SeaweedFS running: the next `up` on that
data dir stops them (by the PIDs in their pid files) and starts its own, instead of connecting
to a server it did not start; while an `up` is alive a second one on its data dir is refused
and touches nothing. A pid file that names any other process (one that reused the PID, or the
same program on another data dir) is stale: removed, and that process is left alone.
"""
from __future__ import annotations

import os
import signal
import subprocess

import httpx
import pytest

from controlplane.embedded import EmbeddedPostgres, EmbeddedS3
from tests.cli.up_process import UpProcess, embedded_env, kill_left, processes_naming, wait_gone

pytestmark = pytest.mark.timeout(300)


def alive(pid: int) -> bool:
    return wait_gone([pid], 0) == [pid]


def test_a_restart_stops_what_a_killed_up_left(tmp_path):
    env = embedded_env(THAWPOOL_WARM_POOL_SIZE="0")
    first = UpProcess(tmp_path / "first", env, "--cpu-slots", "1")
    data_dir = first.data_dir
    try:
        first.wait_banner()
        headers = first.admin_headers()
        assert httpx.post(f"{first.base_url}/v1/tenants", json={"name": "kept"}, headers=headers).status_code == 201
        left = {"postgres": first.postgres_pid(), "weed": first.weed_pid()}

        rival = UpProcess(tmp_path / "rival", env, "--cpu-slots", "1", data_dir=data_dir)
        assert rival.wait(60) == 1, rival.log()[-3000:]
        assert f"the data dir {data_dir} is in use by another thawpool up" in rival.log()
        assert all(alive(pid) for pid in left.values()), "a refused up stops nothing"
        assert httpx.get(f"{first.base_url}/readyz").status_code == 200

        os.kill(first.process.pid, signal.SIGKILL)          # its servers live on, in their own sessions
        first.process.wait(10)
        assert all(alive(pid) for pid in left.values())

        second = UpProcess(tmp_path / "second", env, "--cpu-slots", "1", data_dir=data_dir)
        try:
            second.wait_banner()
            assert wait_gone(left.values(), 0) == [], (left, second.log()[-3000:])
            assert second.postgres_pid() != left["postgres"] and second.weed_pid() != left["weed"]
            tenants = httpx.get(f"{second.base_url}/v1/tenants", headers=headers).json()["data"]
            assert "kept" in [t["name"] for t in tenants], "the data dir's data is kept"
            log = second.log()
            for name, pid in left.items():
                assert f"stopping {name} (PID {pid}) on {data_dir}/" in log and "left running by an earlier run" in log
            second.signal(signal.SIGTERM)
            assert second.wait(90) == 0, second.log()[-3000:]
        finally:
            second.kill_group()
    finally:
        first.kill_group()
        kill_left(processes_naming(data_dir))


@pytest.fixture
def unrelated():
    """A live process that is no server of ours (a PID reused by anything at all)."""
    process = subprocess.Popen(["sleep", "300"])
    try:
        yield process.pid
    finally:
        process.kill()
        process.wait()


def test_a_postgres_pid_file_naming_another_process_is_stale(tmp_path, unrelated, pg_server):
    server = EmbeddedPostgres(tmp_path / "pg").start()
    pid_file = server.data_dir / "postmaster.pid"
    lines = pid_file.read_text().splitlines(keepends=True)
    others = (unrelated, pg_server.pid)       # the session's: Postgres on another dir
    try:
        for other in others:
            server.stop()
            pid_file.write_text("".join([f"{other}\n", *lines[1:]]))   # as a kill -9 leaves it
            server.start()
            assert server.is_running() and server.pid not in others
            assert alive(unrelated) and pg_server.is_running()
    finally:
        server.stop()


def test_a_weed_pid_file_naming_another_process_is_stale(tmp_path, unrelated, s3_server):
    for other in (unrelated, s3_server.process.pid):            # the session's: weed on another dir
        (tmp_path / "s3").mkdir(exist_ok=True)
        (tmp_path / "s3" / "weed.pid").write_text(f"{other}\n")
        server = EmbeddedS3(tmp_path / "s3").start()
        try:
            assert server.process.pid != other and server.pid_file.pid() == server.process.pid
            assert alive(unrelated) and alive(s3_server.process.pid)
            server.ensure_bucket("still-serves")
        finally:
            server.stop()
        assert not (tmp_path / "s3" / "weed.pid").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="as root pgserver runs pg_ctl as its own user, whom chmod can lock out")
def test_a_postgres_whose_pg_ctl_fails_is_stopped_by_its_pid(tmp_path):
    server = EmbeddedPostgres(tmp_path / "pg").start()
    pid = server.pid
    try:
        (server.data_dir / "postmaster.pid").chmod(0)    # pg_ctl cannot read it: "could not open PID file"
        server.stop()
        assert wait_gone([pid], 30) == []
        assert not (server.data_dir / "postmaster.pid").exists()
    finally:
        kill_left(processes_naming(server.data_dir))
