"""`thawpool up --backend ray` stops all it started on SIGTERM (as systemd stops it), sent to
its PID only: ray.init installs SIGTERM handlers of Ray's own, and they must not end the
process before its shutdown has run. A replica of a deployment with min_replicas 1 runs on
the session's loopback cluster; after the signal its actor and runtime process are gone
(by PID), its GPU is free, the namespace holds no replica actor, `up`'s embedded Postgres
and SeaweedFS are gone (by PID from their pid files), the log shows the shutdown, and the
exit code is 0."""
from __future__ import annotations

import signal
import time
import uuid

import httpx
import pytest
import ray

from controlplane.embedded.s3 import ACCESS_KEY, SECRET_KEY
from tests.cli.up_process import (UpProcess, embedded_env, eventually, kill_left, processes_naming,
                                  wait_gone)
from tests.pool_ray.conftest import GPUS_PER_NODE, gpus_free

pytestmark = pytest.mark.timeout(240)


def upload(folder, endpoint: str, bucket: str, prefix: str) -> str:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        client.upload_file(str(file), bucket, f"{prefix}/{file.relative_to(folder)}")
    return f"s3://{bucket}/{prefix}/"


def deploy_one_replica(up: UpProcess, tiny_model) -> None:
    admin = httpx.Client(base_url=up.base_url, headers=up.admin_headers(), timeout=60)
    assert admin.post("/v1/tenants", json={"name": "acme"}).status_code == 201
    granted = admin.post("/v1/model-sources", json={"prefix": "s3://thawpool-models/acme/", "tenant": "acme"})
    assert granted.status_code == 201, granted.text
    key = admin.post("/v1/tenants/acme/keys", json={"scopes": ["deploy"]}).json()["key"]
    uri = upload(tiny_model, up.s3_endpoint(), "thawpool-models", "acme/tiny")
    created = httpx.post(f"{up.base_url}/v1/deployments", timeout=60, headers={"authorization": f"Bearer {key}"},
                         json={"name": "tiny", "model_uri": uri, "resources": {"gpu_memory_gb": 0.25},
                               "scaling": {"min_replicas": 1, "max_replicas": 1},
                               "engine": {"kv_cache_tokens": 256}})
    assert created.status_code == 201, created.text


def replica_actor(namespace: str, timeout_s: float = 120) -> dict:
    """describe() of the pool's replica actor once its runtime process is launched."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for name in named_replicas(namespace):
            where = ray.get(ray.get_actor(name, namespace=namespace).describe.remote(), timeout=30)
            if "child_pid" in where:
                return where
        time.sleep(0.5)
    raise AssertionError(f"no replica actor launched in namespace {namespace}")


def named_replicas(namespace: str) -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == namespace and a["name"].startswith("replica-")]


def test_sigterm_stops_actors_postgres_and_s3(cluster, tiny_model, tmp_path):
    namespace = f"tp-up-{uuid.uuid4().hex[:8]}"
    env = embedded_env(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0",
                       THAWPOOL_RAY_NAMESPACE=namespace, THAWPOOL_WARM_POOL_SIZE="0",
                       THAWPOOL_STOP_TIMEOUT_S="5", THAWPOOL_TICK_S="0.2")
    up = UpProcess(tmp_path, env, "--backend", "ray", "--ray-address", cluster.cluster.address,
                   "--accelerator", "cpu", "--slot-memory-gb", "1")
    try:
        up.wait_banner()
        deploy_one_replica(up, tiny_model)
        where = replica_actor(namespace)
        children = {"postgres": up.postgres_pid(), "weed": up.weed_pid(),
                    "actor": where["pid"], "runtime": where["child_pid"]}
        up.signal(signal.SIGTERM)
        code = up.wait(60)
        left = wait_gone(children.values(), 15)
        assert code == 0, up.log()[-3000:]
        assert left == [], ({name: pid for name, pid in children.items() if pid in left}, up.log()[-3000:])
        assert named_replicas(namespace) == []
        assert eventually(lambda: gpus_free() == GPUS_PER_NODE * len(cluster.workers), 15), gpus_free()
        assert processes_naming(up.data_dir) == []
        log = up.log()
        assert "thawpool: SIGTERM received, stopping" in log and "thawpool: stopped" in log
    finally:
        up.kill_group()
        kill_left(processes_naming(up.data_dir))
        for name in named_replicas(namespace):          # what a failed stop left on the cluster
            ray.kill(ray.get_actor(name, namespace=namespace))
