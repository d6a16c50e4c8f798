"""A hostile tenant's function on `thawpool up`, next to another tenant's function.

The hostile handler (packages/hostile) only looks around with ordinary calls:
who it is, which processes it sees and what it reads of them, the node's files
(keys, Postgres, the weight cache, the other tenant's package and socket, this
checkout), loopback ports and unix sockets, network routes, GPU device files,
calls a handler never needs, a fork bomb and a large allocation. Each test
asserts it found nothing of the node or of the other tenant; each fails on a
pool that runs functions unconfined (THAWPOOL_SANDBOX=off).
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.functions.test_function_deploy import upload
from tests.support.local_index import local_index
from tests.functions.test_function_up import ThawpoolUp, tenant_client

pytestmark = pytest.mark.timeout(600)
HOSTILE = Path(__file__).resolve().parent / "packages" / "hostile"
ROOT = Path(__file__).resolve().parents[2]
PIDS = 64                     # the stack's sandbox_pids: a fork bomb stops there


class Node:
    def __init__(self, base_url: str, data: Path, victim: httpx.Client, mallory: httpx.Client, s3_port: int,
                 admin: httpx.Client, hostile_uri: str):
        self.base_url, self.data, self.victim, self.mallory, self.s3_port = base_url, data, victim, mallory, s3_port
        self.admin, self.hostile_uri = admin, hostile_uri

    def probe(self, probe: str, deployment: str = "hostile", **args: Any) -> dict[str, Any]:
        answer = self.mallory.post(f"/v1/functions/{deployment}/invoke",
                                   json={"input": {"probe": probe, "args": args}})
        assert answer.status_code == 200, answer.text
        return answer.json()["output"]

    def victim_files(self) -> list[str]:
        """The cache entries and socket of the other tenant's replica, as the node has them."""
        entries = [str(p) for p in (self.data / "cache" / "objects").rglob("*") if p.is_file()]
        sockets = [str(p) for p in (self.data / "cache" / "state").rglob("http.sock")]
        return entries + sockets


@pytest.fixture(scope="module")
def node(s3_server, tmp_path_factory, probe_package):
    bucket = f"sec-{uuid.uuid4().hex[:8]}"
    s3_server.ensure_bucket(bucket)
    env = {**os.environ, **s3_server.env(), "THAWPOOL_MODELS_BUCKET": bucket, "THAWPOOL_WARM_POOL_SIZE": "0",
           "THAWPOOL_RUNTIME_THREADS": "1", "THAWPOOL_TICK_S": "0.2", "THAWPOOL_SANDBOX_PIDS": str(PIDS)}
    env.pop("THAWPOOL_DATABASE_URL", None)
    env.pop("THAWPOOL_SANDBOX", None)
    work = tmp_path_factory.mktemp("security")
    stack = ThawpoolUp(work, env, slots=2)      # the victim and mallory; a third for a granted egress
    try:
        admin_key = stack.admin_key()
        victim = tenant_client(stack.base_url, admin_key, "victim", bucket)
        uri = upload(probe_package(max_batch_size=1, max_wait_ms=0), s3_server, bucket, "victim/probe")
        assert victim.post("/v1/deployments", json={"name": "probe", "kind": "function",
                                                     "model_uri": uri}).status_code == 201
        assert victim.post("/v1/functions/probe/invoke", json={"input": {"echo": 1}}).status_code == 200
        mallory = tenant_client(stack.base_url, admin_key, "mallory", bucket)
        uri = upload(HOSTILE, s3_server, bucket, "mallory/hostile")
        created = mallory.post("/v1/deployments", json={"name": "hostile", "kind": "function", "model_uri": uri})
        assert created.status_code == 201, created.text
        s3_port = int(s3_server.endpoint.rsplit(":", 1)[1])
        admin = httpx.Client(base_url=stack.base_url, headers={"authorization": f"Bearer {admin_key}"}, timeout=60)
        yield Node(stack.base_url, work / "data", victim, mallory, s3_port, admin, uri)
    finally:
        stack.stop()


def test_it_runs_as_an_unprivileged_uid_with_no_capabilities(node):
    me = node.probe("identity")
    assert me["uid"] != 0 and me["euid"] != 0 and me["gid"] != 0
    assert int(me["cap_eff"], 16) == 0 and int(me["cap_bnd"], 16) == 0
    assert me["no_new_privs"] == "1" and me["seccomp"] == "2"          # 2: a filter is loaded


def test_it_sees_no_other_process_and_no_secret(node):
    found = node.probe("processes")
    assert len(found["pids"]) <= 4, found["pids"]                       # its sandbox's init, itself
    for pid, seen in found["seen"].items():
        assert "controlplane" not in seen["cmdline"] and "postgres" not in seen["cmdline"]
        assert "weed" not in seen["cmdline"] and "probe" not in seen["cmdline"]
        assert "THAWPOOL_REPLICA_SECRET=" not in seen["environ"] and "AWS_" not in seen["environ"], pid


def test_it_reads_nothing_of_the_node_or_the_other_tenant(node):
    data = node.data
    paths = [str(data / "admin-key"), str(data / "secrets-key"), str(data), str(data / "postgres"),
             str(data / "cache"), str(data / "cache" / "objects"), str(data / "cache" / "state"),
             str(data / "logs"), "/root", "/home", "/etc/shadow", "/etc/passwd", str(ROOT / "README.md"),
             str(ROOT / "controlplane"), str(ROOT / "pool"), *node.victim_files()]
    # /root holds nothing but the way to the platform's interpreter, bound read-only
    assert node.probe("files", paths=paths)["found"] == {"/root": [".pyenv"]}
    mine = node.probe("files", paths=["/srv/package/weights.txt"])["found"]
    assert mine == {"/srv/package/weights.txt": "hostile\n"}             # the probe can read what is there


def test_it_writes_nothing_outside_its_tmp(node):
    canary = node.data.parent / "canary"            # the node's files, and never this checkout's
    canary.write_text("")
    written = node.probe("write", paths=["/srv/package/weights.txt", "/srv/venv/pyvenv.cfg", str(canary),
                                         str(node.data / "admin-key"), "/tmp/mine"])["written"]
    assert written == ["/tmp/mine"] and canary.read_text() == ""


def test_it_reaches_no_port_socket_or_route(node):
    data = node.data
    postgres = [str(p) for p in (data / "postgres").glob(".s.PGSQL.*")] or [str(data / "postgres" / ".s.PGSQL.5432")]
    cp_port = int(node.base_url.rsplit(":", 1)[1])
    reached = node.probe("connect", tcp=[["127.0.0.1", cp_port], ["127.0.0.1", node.s3_port]],
                         unix=[*postgres, *(f for f in node.victim_files() if f.endswith(".sock"))])
    assert reached["reached"] == []
    net = node.probe("network")
    assert net["interfaces"] == ["lo"] and net["routes"] == []           # no route to 169.254.169.254 or anywhere


def test_it_opens_no_gpu_and_makes_no_forbidden_call(node):
    assert node.probe("devices")["gpu"] == []
    refused = node.probe("syscalls")
    assert all(code != 0 for code in refused.values()), refused


def test_a_fork_bomb_stops_at_the_pids_limit_and_memory_at_its_limit(node):
    bomb = node.probe("fork_bomb", tries=4 * PIDS)
    assert bomb["refused"] == "EAGAIN" and bomb["forked"] < PIDS
    grown = node.probe("memory", mb=8192)                              # past the replica's 3.3 GB
    assert grown["returncode"] != 0
    # the other tenant's function still answers
    assert node.victim.post("/v1/functions/probe/invoke", json={"input": {"echo": 2}}).status_code == 200


def test_a_cold_start_refuses_where_no_sandbox_can_be_made(tmp_path, monkeypatch):
    """Fail closed: without bubblewrap on PATH, a function replica does not start."""
    from pool.api import ColdStartFailed
    from pool.function_sandbox import FunctionSandboxes
    from pool.settings import PoolSettings

    monkeypatch.setenv("PATH", str(tmp_path))                           # a node with no bwrap
    sandboxes = FunctionSandboxes.from_settings(PoolSettings(cache_dir=tmp_path))
    assert sandboxes is not None
    with pytest.raises(ColdStartFailed, match="bwrap"):
        sandboxes.uid("tenant")
    assert FunctionSandboxes.from_settings(PoolSettings(cache_dir=tmp_path, sandbox="off")) is None
    with pytest.raises(ValueError, match="sandbox"):
        PoolSettings(sandbox="none")


def test_it_reaches_the_hosts_the_operator_granted_and_no_other(node, tmp_path):
    (tmp_path / "www").mkdir()
    with local_index(tmp_path / "none", tmp_path / "www") as granted:
        port = int(granted.split(":")[2].split("/")[0])
        assert "error" in node.probe("fetch", url=granted), "no grant: no way out at all"
        made = node.admin.patch("/v1/tenants/mallory/quota", json={"egress": [f"127.0.0.1:{port}"]})
        assert made.status_code == 200, made.text
        deployed = node.mallory.post("/v1/deployments", json={"name": "reaches", "kind": "function",
                                                               "model_uri": node.hostile_uri})
        assert deployed.status_code == 201, deployed.text
        try:
            assert node.probe("fetch", "reaches", url=granted) == {"status": 200}
            for elsewhere in (f"{node.base_url}/readyz", f"http://127.0.0.1:{node.s3_port}/",
                              "http://169.254.169.254/latest/meta-data/"):
                assert node.probe("fetch", "reaches", url=elsewhere) == {"status": 403}, elsewhere
            assert node.probe("connect", "reaches", tcp=[["127.0.0.1", port]], unix=[])["reached"] == [], \
                "only through the proxy"
        finally:
            node.admin.patch("/v1/tenants/mallory/quota", json={"egress": None})
            node.mallory.delete("/v1/deployments/reaches")
