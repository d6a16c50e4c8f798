"""The README's path end to end: `thawpool up` as its own process, the example classifier
uploaded to the tenant's prefix, deployed with kind "function", invoked over HTTP,
billed; and a function's process holds none of the platform's credentials, which
`thawpool up` itself has in its environment."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from controlplane.embedded.ports import free_port
from tests.controlplane.support.servers import RuntimeProcess
from tests.functions.conftest import ROOT
from tests.functions.test_function_deploy import upload

pytestmark = pytest.mark.timeout(600)


class ThawpoolUp(RuntimeProcess):
    """`thawpool up` as its own process (embedded Postgres, the session's S3), stopped by
    PID like a runtime (SIGTERM to its group: it stops its replicas and Postgres)."""

    def __init__(self, work: Path, env: dict[str, str], slots: int = 1):
        self.port, self.log_path = free_port(), work / "up.log"
        self.base_url, self.key_file = f"http://127.0.0.1:{self.port}", work / "data" / "admin-key"
        with open(self.log_path, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "controlplane.cli.main", "up", "--data-dir", str(work / "data"),
                 "--port", str(self.port), "--cpu-slots", str(slots), "--slot-memory-gb", "2"], cwd=ROOT, env=env,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def admin_key(self, timeout_s: float = 240) -> str:
        """Once the banner is out (the key file is written before it)."""
        deadline = time.monotonic() + timeout_s
        while "admin key" not in self.log_path.read_text(errors="replace"):
            assert self.process.poll() is None and time.monotonic() < deadline, \
                self.log_path.read_text()[-2000:]
            time.sleep(0.2)
        return self.key_file.read_text().strip()


@pytest.fixture(scope="module")
def up(s3_server, tmp_path_factory):
    """(base_url, admin key, bucket) of a running `thawpool up`."""
    bucket = f"fn-up-{uuid.uuid4().hex[:8]}"
    s3_server.ensure_bucket(bucket)
    env = {**os.environ, **s3_server.env(), "THAWPOOL_MODELS_BUCKET": bucket,
           "THAWPOOL_WARM_POOL_SIZE": "0", "THAWPOOL_RUNTIME_THREADS": "1", "THAWPOOL_TICK_S": "0.2",
           "THAWPOOL_PRICE_PER_CALL": "0.0001", "THAWPOOL_PRICE_GPU_SECOND": "0.001"}
    env.pop("THAWPOOL_DATABASE_URL", None)
    stack = ThawpoolUp(tmp_path_factory.mktemp("fn-up"), env)
    try:
        yield stack.base_url, stack.admin_key(), bucket
    finally:
        stack.stop()


def tenant_client(base_url: str, admin_key: str, tenant: str, bucket: str) -> httpx.Client:
    """A new tenant granted s3://<bucket>/<tenant>/, where these tests put its packages."""
    admin = httpx.Client(base_url=base_url, headers={"authorization": f"Bearer {admin_key}"}, timeout=60)
    assert admin.post("/v1/tenants", json={"name": tenant}).status_code == 201
    granted = admin.post("/v1/model-sources", json={"prefix": f"s3://{bucket}/{tenant}/", "tenant": tenant})
    assert granted.status_code == 201, granted.text
    made = admin.post(f"/v1/tenants/{tenant}/keys", json={"scopes": ["deploy", "invoke", "billing:read"]})
    return httpx.Client(base_url=base_url, timeout=240,
                        headers={"authorization": f"Bearer {made.json()['key']}"})


def test_the_example_function_through_thawpool_up(up, s3_server, example_package: Path, probe_package):
    base_url, admin_key, bucket = up
    client = tenant_client(base_url, admin_key, "acme", bucket)
    uri = upload(example_package, s3_server, bucket, "acme/text-classifier")
    created = client.post("/v1/deployments", json={"name": "sentiment", "kind": "function", "model_uri": uri})
    assert created.status_code == 201, created.text
    answer = client.post("/v1/functions/sentiment/invoke", json={"inputs": [
        {"text": "a wonderful, delightful evening"}, {"text": "the service was awful and slow"}]})
    assert answer.status_code == 200, answer.text
    assert [o["label"] for o in answer.json()["outputs"]] == ["positive", "negative"]
    assert answer.json()["usage"]["items"] == 2

    report = client.get("/v1/billing/report", params={"from": "2020-01-01", "to": "2100-01-01",
                                                       "group_by": "deployment"})
    assert report.status_code == 200 and "sentiment" in report.text

    probe = upload(probe_package(max_batch_size=1, max_wait_ms=0), s3_server, bucket, "acme/probe")
    assert client.post("/v1/deployments", json={"name": "probe", "kind": "function",
                                                 "model_uri": probe}).status_code == 201
    env = client.post("/v1/functions/probe/invoke", json={"input": {"env": True}})
    names = set(env.json()["output"]["env"])
    assert names and not names & {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "THAWPOOL_S3_ENDPOINT",
                                  "THAWPOOL_DATABASE_URL", "THAWPOOL_REPLICA_SECRET"}
