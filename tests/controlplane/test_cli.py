"""The `thawpool` command: the admin's tenants and keys against a live server, and `up` as a process."""
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from controlplane.cli.main import main
from controlplane.embedded.ports import free_port
from tests.controlplane.conftest import make_settings, running_control_plane
from tests.controlplane.support.servers import REPO

in_session_loop = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-cli"))
    async with running_control_plane(settings) as plane:
        yield plane


async def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@in_session_loop
async def test_the_admin_manages_tenants_and_keys_from_one_command_tree(plane, capsys):
    auth = ["--url", plane.base_url, "--key", plane.admin_key, "--json"]
    code, out, _ = await run_cli(capsys, "tenants", "create", "cli-co", *auth)
    assert code == 0 and json.loads(out)["name"] == "cli-co"
    code, out, _ = await run_cli(capsys, "keys", "create", "--tenant", "cli-co",
                                 "--scopes", "invoke,deploy,billing:read", *auth)
    assert code == 0
    made = json.loads(out)
    client = plane.client(made["key"])
    assert (await client.get("/v1/deployments")).status_code == 200
    code, out, _ = await run_cli(capsys, "keys", "revoke", made["prefix"], *auth)
    assert code == 0 and json.loads(out)["revoked_at"]
    assert (await client.get("/v1/deployments")).status_code == 401
    code, _, err = await run_cli(capsys, "tenants", "create", "cli-co", *auth)
    assert code == 1 and "409" in err
    code, _, err = await run_cli(capsys, "tenants", "create", "nope", "--url", plane.base_url,
                                 "--key", made["key"])
    assert code == 1 and "401" in err
    with pytest.raises(SystemExit) as usage:            # one tree: the old spelling is gone
        await run_cli(capsys, "admin", "create-tenant", "cli-co")
    assert usage.value.code == 2 and "invalid choice" in capsys.readouterr().err


@in_session_loop
async def test_budgets_are_set_listed_and_removed_from_the_cli(plane, capsys):
    auth = ["--url", plane.base_url, "--key", plane.admin_key, "--json"]
    assert (await run_cli(capsys, "tenants", "create", "cli-budget", *auth))[0] == 0
    code, out, err = await run_cli(capsys, "budgets", "set", "tenant", "--tenant", "cli-budget", "--limit", "12.5",
                                   "--period", "day", "--time-zone", "Asia/Tokyo", "--soft-fraction", "0.9", *auth)
    assert code == 0, err
    made = json.loads(out)
    assert (made["scope"], made["period"], made["time_zone"], made["soft_fraction"]) == (
        "tenant", "day", "Asia/Tokyo", "0.9")
    code, out, _ = await run_cli(capsys, "budgets", "ls", "--tenant", "cli-budget", *auth)
    assert code == 0 and [b["id"] for b in json.loads(out)] == [made["id"]]
    code, _, err = await run_cli(capsys, "budgets", "set", "key", "--limit", "1", *auth)
    assert code == 2 and "names its target" in err
    code, _, err = await run_cli(capsys, "budgets", "set", "tenant", "--tenant", "cli-budget", "--limit", "x", *auth)
    assert code == 1 and "422" in err and "limit" in err
    assert (await run_cli(capsys, "budgets", "rm", made["id"], *auth))[0] == 0
    code, out, _ = await run_cli(capsys, "budgets", "ls", "--tenant", "cli-budget", *auth)
    assert json.loads(out) == []


def start_up(data_dir: Path, port: int, log: Path, s3_server) -> subprocess.Popen:
    """Embedded Postgres; S3 is the session's server, because SeaweedFS binds fixed
    Lance/Iceberg ports (9101, 8181) and a second `weed server` on one host dies."""
    env = {**os.environ, **s3_server.env(), "THAWPOOL_WARM_POOL_SIZE": "0",
           "PYTHONUNBUFFERED": "1"}
    env.pop("THAWPOOL_DATABASE_URL", None)
    return subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli.main", "up", "--data-dir", str(data_dir),
         "--port", str(port), "--cpu-slots", "1", "--slot-memory-gb", "2"],
        cwd=REPO, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
        start_new_session=True)


def wait_banner(process: subprocess.Popen, log: Path, timeout_s: float = 240) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if "thawpool: admin key" in text:
            return text
        if process.poll() is not None:
            raise AssertionError(f"thawpool up exited early:\n{text[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"no banner:\n{log.read_text()[-3000:]}")


def stop(process: subprocess.Popen) -> int:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            return process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            return process.wait(timeout=10)
    return process.returncode


def children_alive(data_dir: Path) -> list[str]:
    from pgserver.utils import PostmasterInfo

    alive = []
    info = PostmasterInfo.read_from_pgdata(data_dir / "postgres")
    if info is not None and info.is_running():
        alive.append("postgres")
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    if f"-dir={data_dir / 's3'}" in ps:
        alive.append("weed")
    return alive


@pytest.mark.slow
def test_up_stops_its_children_and_keeps_its_data(tmp_path, s3_server):
    data_dir, port = tmp_path / "data", free_port()
    first = start_up(data_dir, port, tmp_path / "first.log", s3_server)
    try:
        banner = wait_banner(first, tmp_path / "first.log")
        assert "tp_" not in banner, "off a terminal the admin key never reaches the log"
        key_file = data_dir / "admin-key"
        assert f"written to {key_file}" in banner
        assert key_file.stat().st_mode & 0o777 == 0o600
        admin_key = key_file.read_text().strip()
        headers = {"authorization": f"Bearer {admin_key}"}
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/readyz").status_code == 200
        assert httpx.post(f"{base}/v1/tenants", json={"name": "kept"},
                          headers=headers).status_code == 201
    finally:
        code = stop(first)
    assert code == 0, (tmp_path / "first.log").read_text()[-3000:]
    assert children_alive(data_dir) == []
    assert "thawpool: stopped" in (tmp_path / "first.log").read_text()

    second = start_up(data_dir, port, tmp_path / "second.log", s3_server)
    try:
        banner = wait_banner(second, tmp_path / "second.log")
        assert "tp_" not in banner, "the admin key is printed on first start only"
        tenants = httpx.get(f"http://127.0.0.1:{port}/v1/tenants", headers=headers).json()
        assert "kept" in [t["name"] for t in tenants["data"]]
    finally:
        code = stop(second)
    assert code == 0, (tmp_path / "second.log").read_text()[-3000:]
    assert children_alive(data_dir) == []


POOL_ENV = ("THAWPOOL_BACKEND", "THAWPOOL_RAY_ADDRESS", "THAWPOOL_RAY_REPLICA_HOST")


def pool_settings_of(tmp_path, *argv):
    from controlplane.cli.main import build_parser
    from controlplane.cli.up import pool_settings_for
    from controlplane.settings import Settings

    return pool_settings_for(Settings(database_url="", data_dir=tmp_path), build_parser().parse_args(["up", *argv]))


def test_up_backend_flags_and_env_become_pool_settings(tmp_path, monkeypatch):
    for name in POOL_ENV:
        monkeypatch.delenv(name, raising=False)
    assert pool_settings_of(tmp_path).backend == "local"
    ray = pool_settings_of(tmp_path, "--backend", "ray", "--ray-address", "10.0.0.5:6379")
    assert (ray.backend, ray.ray_address, ray.cache_dir) == ("ray", "10.0.0.5:6379", tmp_path / "cache")
    assert pool_settings_of(tmp_path, "--ray-address", "auto").backend == "ray"     # address implies ray
    monkeypatch.setenv("THAWPOOL_BACKEND", "ray")
    monkeypatch.setenv("THAWPOOL_RAY_ADDRESS", "head:6379")
    monkeypatch.setenv("THAWPOOL_RAY_REPLICA_HOST", "0.0.0.0")
    from_env = pool_settings_of(tmp_path)
    assert (from_env.backend, from_env.ray_address, from_env.ray_replica_host) == ("ray", "head:6379", "0.0.0.0")
    assert pool_settings_of(tmp_path, "--backend", "local").backend == "local"      # flags win
    with pytest.raises(SystemExit):
        pool_settings_of(tmp_path, "--backend", "k8s")


def test_banner_hides_the_database_password():
    from controlplane.cli.up import _without_password

    shown = _without_password("postgresql+asyncpg://tp:s3cr%2Ft@db.internal:5432/thawpool?ssl=require")
    assert "s3cr" not in shown and shown.startswith("postgresql+asyncpg://tp:***@db.internal:5432/thawpool")


def test_the_admin_key_goes_to_the_terminal_or_a_0600_file(tmp_path):
    import io

    from controlplane.cli.admin_key import announce

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert "tp_secret" in announce("tp_secret", tmp_path / "a", Terminal())
    assert not (tmp_path / "a").exists(), "nothing written when a person reads the terminal"
    line = announce("tp_secret", tmp_path / "b", io.StringIO())
    assert "tp_secret" not in line
    assert (tmp_path / "b" / "admin-key").read_text() == "tp_secret\n"
    assert (tmp_path / "b" / "admin-key").stat().st_mode & 0o777 == 0o600
    announce("tp_newer", tmp_path / "b", io.StringIO())      # all admin keys revoked: a new one
    assert (tmp_path / "b" / "admin-key").read_text() == "tp_newer\n"
