"""A push killed midway continues where it stopped: only the parts not yet uploaded are
sent again, and the object in S3 is the file, byte for byte."""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess

import pytest

from tests.cli.stack import PART_BYTES, REPO, cli_command, ok_json, run_cli

pytestmark = pytest.mark.timeout(300)
PARTS = 8


def test_a_killed_push_resumes_with_the_parts_left(stack, tenant, tmp_path, s3_server):
    model = tmp_path / "big"
    model.mkdir()
    (model / "weights.bin").write_bytes(os.urandom(PARTS * PART_BYTES - 12345))
    (model / "config.json").write_text("{}")
    argv = cli_command("models", "push", str(model), "big", "--parallel", "1")
    first = subprocess.Popen(argv, cwd=REPO, env=tenant.env, stderr=subprocess.PIPE, text=True)
    try:
        for line in first.stderr:
            if "weights.bin part" in line:       # recorded before it is printed: kill now
                first.send_signal(signal.SIGKILL)
                break
    finally:
        first.kill()
        first.wait()
    assert first.returncode == -signal.SIGKILL, "the push finished before it could be killed"
    assert [u["status"] for u in ok_json(tenant.env, "models", "ls")] == ["pending"]

    second = run_cli(tenant.env, "models", "push", str(model), "big", "--json")
    assert second.returncode == 0, second.stderr
    resumed = int(re.search(r"resuming big: (\d+) parts already uploaded", second.stderr)[1])
    assert resumed >= 1
    sent = re.findall(r"(weights\.bin|config\.json) part (\d+)/\d+ uploaded", second.stderr)
    assert len(sent) == PARTS + 1 - resumed, "only the parts left were sent again"
    upload = json.loads(second.stdout)
    assert upload["status"] == "complete"

    bucket, _, prefix = upload["model_uri"].removeprefix("s3://").partition("/")
    body = s3_server.client().get_object(Bucket=bucket, Key=f"{prefix}weights.bin")["Body"].read()
    assert hashlib.sha256(body).digest() == hashlib.sha256((model / "weights.bin").read_bytes()).digest()
    assert run_cli(tenant.env, "models", "push", str(model), "big").returncode == 1, \
        "a second push of a finished name is refused (409), not silently re-uploaded"
    assert ok_json(tenant.env, "models", "rm", "big") == {"deleted": "big"}
