"""A real `thawpool up` for the CLI and console tests, and the CLI run as users run it.

`thawpool up` runs as a process of its own with its embedded Postgres; S3 is the test
session's SeaweedFS (a second `weed server` on one host dies on its fixed ports), with a
models bucket of this stack's own. The CLI runs as a subprocess with a config dir of the
test's own, so profiles never touch the user's.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from controlplane.embedded.ports import free_port
from tests.controlplane.test_cli import stop, wait_banner     # how test_cli runs `up`

REPO = Path(__file__).resolve().parents[2]
PART_BYTES = 5 * 1024 ** 2          # S3's smallest part: many parts from small files
THAWPOOL = Path(sys.executable).with_name("thawpool")


@dataclass
class Stack:
    base_url: str
    admin_key: str
    data_dir: Path
    log: Path
    bucket: str
    process: subprocess.Popen


def up_env(s3_server, bucket: str) -> dict[str, str]:
    env = {**os.environ, **s3_server.env(), "PYTHONUNBUFFERED": "1",
           "THAWPOOL_MODELS_BUCKET": bucket, "THAWPOOL_UPLOAD_PART_BYTES": str(PART_BYTES),
           "THAWPOOL_WARM_POOL_SIZE": "0", "THAWPOOL_RUNTIME_THREADS": "1",
           "THAWPOOL_KV_CACHE_TOKENS_DEFAULT": "512", "THAWPOOL_TICK_S": "0.2",
           "THAWPOOL_PRICE_INPUT_PER_MTOK": "1", "THAWPOOL_PRICE_OUTPUT_PER_MTOK": "2",
           "THAWPOOL_PRICE_GPU_SECOND": "0.001", "THAWPOOL_GPU_COST_PER_SECOND": "0.0004"}
    for name in ("THAWPOOL_DATABASE_URL", "THAWPOOL_URL", "THAWPOOL_API_KEY",
                 "THAWPOOL_ADMIN_KEY", "THAWPOOL_PROFILE"):
        env.pop(name, None)
    return env


def start_stack(s3_server, work: Path) -> Stack:
    bucket = f"cli-{uuid.uuid4().hex[:10]}"
    s3_server.ensure_bucket(bucket)
    data_dir, port, log = work / "data", free_port(), work / "up.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli.main", "up", "--data-dir", str(data_dir),
         "--port", str(port), "--cpu-slots", "1", "--slot-memory-gb", "2"],
        cwd=REPO, env=up_env(s3_server, bucket), stdout=open(log, "wb"),
        stderr=subprocess.STDOUT, start_new_session=True)
    stack = Stack(f"http://127.0.0.1:{port}", "", data_dir, log, bucket, process)
    try:
        wait_banner(process, log)
    except BaseException:
        stop_stack(stack)
        raise
    stack.admin_key = (data_dir / "admin-key").read_text().strip()
    return stack


def stop_stack(stack: Stack) -> None:
    """SIGTERM (up stops its replicas and Postgres), then the whole group if it hangs."""
    stop(stack.process)


def cli_env(config_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("THAWPOOL_") and not k.startswith("XDG_")}
    return {**env, "THAWPOOL_CONFIG_DIR": str(config_dir), "COLUMNS": "200", **extra}


def cli_command(*argv: str) -> list[str]:
    """`thawpool ...` as installed (the venv's console script), else via -m."""
    if THAWPOOL.exists():
        return [str(THAWPOOL), *argv]
    return [sys.executable, "-m", "controlplane.cli.main", *argv]


def run_cli(env: dict[str, str], *argv: str, stdin: Optional[str] = None,
            timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cli_command(*argv), cwd=REPO, env=env, input=stdin, text=True,
                          capture_output=True, timeout=timeout_s)


def ok_json(env: dict[str, str], *argv: str, stdin: Optional[str] = None):
    """The command's --json result; fails the test with its stderr when it exits non-zero."""
    done = run_cli(env, *argv, "--json", stdin=stdin)
    assert done.returncode == 0, f"thawpool {' '.join(argv)}: {done.returncode}\n{done.stderr}"
    return json.loads(done.stdout)


_SHARED: dict = {"stack": None, "users": 0}


@contextlib.contextmanager
def shared_stack(s3_server, work: Path) -> Iterator[Stack]:
    """One stack for the CLI and the console tests of a session (a second `thawpool up`
    would cost its start again): started by the first user, stopped by the last."""
    if _SHARED["stack"] is None:
        _SHARED["stack"] = start_stack(s3_server, work)
    _SHARED["users"] += 1
    try:
        yield _SHARED["stack"]
    finally:
        _SHARED["users"] -= 1
        if _SHARED["users"] == 0:
            stack, _SHARED["stack"] = _SHARED["stack"], None
            stop_stack(stack)


@dataclass
class Tenant:
    name: str
    key: str
    env: dict
    url: str


def new_tenant(stack: Stack, name: str, configs: Path) -> Tenant:
    """A tenant made with `thawpool tenants create` / `keys create` (the admin key from the
    environment), logged in as the current profile of a config dir of its own."""
    admin = cli_env(configs / "admin", THAWPOOL_URL=stack.base_url,
                    THAWPOOL_ADMIN_KEY=stack.admin_key)
    ok_json(admin, "tenants", "create", name)
    key = ok_json(admin, "keys", "create", "--tenant", name,
                  "--scopes", "invoke,deploy,billing:read")["key"]
    env = cli_env(configs / name)
    ok_json(env, "login", "--url", stack.base_url, "--key", key, "--profile", name)
    return Tenant(name, key, env, stack.base_url)


def api_tenant(stack: Stack, name: str, configs: Path) -> Tenant:
    """A tenant made through the admin API (no CLI start-up paid), its key in the
    environment of a config dir of its own."""
    import httpx

    with httpx.Client(base_url=stack.base_url, timeout=30,
                      headers={"authorization": f"Bearer {stack.admin_key}"}) as admin:
        assert admin.post("/v1/tenants", json={"name": name}).status_code == 201
        made = admin.post(f"/v1/tenants/{name}/keys",
                          json={"scopes": ["invoke", "deploy", "billing:read"]})
        assert made.status_code == 201, made.text
    key = made.json()["key"]
    return Tenant(name, key, cli_env(configs / name, THAWPOOL_URL=stack.base_url,
                                     THAWPOOL_API_KEY=key), stack.base_url)
