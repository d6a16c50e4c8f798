"""The whole workflow through the `thawpool` command against a real `thawpool up`:
push a model, deploy it, watch it thaw, complete, chat, read the bill, split traffic,
roll back, delete; exit codes and one-line errors."""
from __future__ import annotations

import json
import os
import re
import time

import httpx
import pytest

from tests.cli.stack import cli_env, ok_json, run_cli

pytestmark = pytest.mark.timeout(400)


def test_login_keeps_the_profile_private_and_refused_keys_out(stack, tenant, tmp_path):
    profiles = tenant.env["THAWPOOL_CONFIG_DIR"] + "/profiles.json"
    assert os.stat(profiles).st_mode & 0o777 == 0o600
    stored = json.load(open(profiles))
    assert stored["current"] == "acme" and stored["profiles"]["acme"]["key"] == tenant.key
    bad = run_cli(cli_env(tmp_path), "login", "--url", stack.base_url, "--key", "tp_wrong_key")
    assert bad.returncode == 1 and not (tmp_path / "profiles.json").exists()
    assert re.fullmatch(r"thawpool: error: 401 \S+: .+ \(request id \S+\)\n", bad.stderr), bad.stderr


def test_exit_codes_and_one_line_errors(stack, tenant, tmp_path):
    missing = run_cli(tenant.env, "status", "no-such-deployment")
    assert missing.returncode == 1
    assert re.fullmatch(r"thawpool: error: 404 deployment_not_found: .+ \(request id \S+\)\n",
                        missing.stderr), missing.stderr
    as_json = run_cli(tenant.env, "status", "no-such-deployment", "--json")
    error = json.loads(as_json.stderr)["error"]
    assert as_json.returncode == 1 and error["status"] == 404 and error["request_id"]
    assert run_cli(tenant.env, "deploy").returncode == 2                       # argparse
    assert run_cli(tenant.env, "traffic", "x", "r1:90").returncode == 2          # not NAME=N
    keyless = run_cli(cli_env(tmp_path, THAWPOOL_URL=stack.base_url), "ls")
    assert keyless.returncode == 2 and "thawpool login" in keyless.stderr
    unknown = run_cli(tenant.env, "ls", "--profile", "nobody")
    assert unknown.returncode == 2 and "no profile 'nobody'" in unknown.stderr
    by_env = run_cli({**tenant.env, "THAWPOOL_API_KEY": "tp_env_wins"}, "ls")
    assert by_env.returncode == 1 and "401" in by_env.stderr, "the environment overrides the profile"


def test_push_deploy_thaw_chat_and_bill(tenant, tiny_model):
    env = tenant.env
    pushed = run_cli(env, "models", "push", str(tiny_model), "tiny")
    assert pushed.returncode == 0, pushed.stderr
    assert "s3://" in pushed.stdout and "/tenants/" in pushed.stdout and "/tiny/" in pushed.stdout
    assert "model.safetensors part 1/1 uploaded" in pushed.stderr
    assert [(u["name"], u["status"]) for u in ok_json(env, "models", "ls")] == [("tiny", "complete")]

    deployed = ok_json(env, "deploy", "tiny-chat", "--model", "tiny", "--max-replicas", "1",
                       "--idle-timeout", "600")
    assert deployed["traffic"] == {"r1": 100}
    assert "/tenants/" in deployed["revisions"][0]["model_uri"]
    assert deployed["revisions"][0]["model_uri"].endswith("/tiny/")
    assert ok_json(env, "status", "tiny-chat")["status"]["r1"]["state"] == "scaled_to_zero"

    completed = run_cli(env, "complete", "tiny-chat", "Hello there", "--max-tokens", "6",
                        "--temperature", "0")
    assert completed.returncode == 0, completed.stderr
    assert "thawing: replica" in completed.stderr, "the cold start is shown, not waited silently"
    assert re.search(r"\[\d+ prompt \+ 6 completion tokens, request id \S+\]", completed.stderr)

    watched = run_cli(env, "status", "tiny-chat", "--watch", "--until", "ready",
                      "--interval", "0.2", "--timeout", "60", "--json")
    assert watched.returncode == 0, watched.stderr
    last = json.loads(watched.stdout.strip().splitlines()[-1])
    assert last["status"]["r1"]["state"] == "ready"
    assert [s["state"] for s in next(iter(last["stages"].values()))] == ["ready"]
    table = run_cli(env, "status", "tiny-chat")
    assert table.returncode == 0 and "ready" in table.stdout and "r1" in table.stdout

    turns = run_cli(env, "chat", "tiny-chat", "--max-tokens", "4", "--json",
                    stdin="hello\nand again\n")
    assert turns.returncode == 0, turns.stderr
    first, second = [json.loads(line) for line in turns.stdout.splitlines()]
    assert first["role"] == "assistant" and first["usage"]["completion_tokens"] == 4
    assert second["usage"]["prompt_tokens"] > first["usage"]["prompt_tokens"] + 2, \
        "the second turn carries the conversation"

    row = _report_row(tenant, "tiny-chat", requests=3)
    assert row["completion_tokens"] == 6 + 4 + 4
    assert float(row["token_cost"]) > 0
    table = run_cli(env, "usage", "--group-by", "deployment")
    assert table.returncode == 0 and "tiny-chat" in table.stdout and "TOTAL" in table.stdout
    csv = run_cli(env, "usage", "--group-by", "deployment", "--csv")
    assert csv.stdout.splitlines()[0].startswith("key,requests") and "TOTAL" in csv.stdout


def test_revisions_traffic_rollback_and_rm(tenant):
    env = tenant.env
    second = ok_json(env, "deploy", "tiny-chat", "--model", "tiny", "--engine",
                     "kv_cache_tokens=256", "--no-promote")
    assert [r["name"] for r in second["revisions"]] == ["r1", "r2"]
    assert second["traffic"] == {"r1": 100}
    assert ok_json(env, "traffic", "tiny-chat", "r1=50", "r2=50")["traffic"] == {"r1": 50, "r2": 50}
    refused = run_cli(env, "traffic", "tiny-chat", "r1=50", "r2=60")
    assert refused.returncode == 1 and "request id" in refused.stderr
    assert ok_json(env, "rollback", "tiny-chat")["traffic"] == {"r1": 100}
    listed = run_cli(env, "ls")
    assert listed.returncode == 0 and "tiny-chat" in listed.stdout
    assert ok_json(env, "rm", "tiny-chat") == {"deleted": "tiny-chat"}
    assert ok_json(env, "ls") == []


def _report_row(tenant, deployment: str, requests: int) -> dict:
    """The deployment's row of `thawpool usage --json`, once its usage rows are written
    (the writer batches: waited for through the API, which costs no CLI start)."""
    params = {"group_by": "deployment"}
    with httpx.Client(base_url=tenant.url, timeout=30,
                      headers={"authorization": f"Bearer {tenant.key}"}) as client:
        deadline = time.monotonic() + 60
        while sum(r["requests"] for r in client.get("/v1/billing/report", params=params)
                  .json()["rows"] if r["key"] == deployment) < requests:
            assert time.monotonic() < deadline, "the usage rows were never written"
            time.sleep(0.2)
    rows = [r for r in ok_json(tenant.env, "usage", "--group-by", "deployment")["rows"]
            if r["key"] == deployment]
    assert len(rows) == 1 and rows[0]["requests"] == requests, rows
    return rows[0]


def test_a_pushed_gguf_deploys_as_its_file(tenant, tiny_model, tmp_path):
    from tests.support.gguf_files import write_model_gguf

    gguf = tmp_path / "tiny.Q8_0.gguf"
    write_model_gguf(gguf, tiny_model, "Q8_0")
    pushed = ok_json(tenant.env, "models", "push", str(gguf), "tiny-gguf")
    assert [f["path"] for f in pushed["files"]] == ["tiny.Q8_0.gguf"]
    deployed = ok_json(tenant.env, "deploy", "gguf-chat", "--model", "tiny-gguf")
    assert deployed["revisions"][0]["model_uri"] == pushed["model_uri"] + "tiny.Q8_0.gguf"
    assert ok_json(tenant.env, "rm", "gguf-chat") == {"deleted": "gguf-chat"}


def test_a_tenant_lists_and_revokes_its_own_keys(stack, tenant):
    with httpx.Client(base_url=stack.base_url, timeout=30,
                      headers={"authorization": f"Bearer {stack.admin_key}"}) as admin:
        spare = admin.post("/v1/tenants/acme/keys", json={"scopes": ["invoke"]}).json()
    listed = [k["prefix"] for k in ok_json(tenant.env, "keys", "ls")]
    assert spare["prefix"] in listed and tenant.key.startswith(tuple(listed))
    assert ok_json(tenant.env, "keys", "revoke", spare["prefix"])["revoked_at"]
    with httpx.Client(base_url=stack.base_url, timeout=30) as client:
        auth = {"authorization": f"Bearer {spare['key']}"}
        assert client.get("/v1/models", headers=auth).status_code == 401
