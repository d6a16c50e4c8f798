"""`thawpool adapters push|ls|rm` end to end against a real `thawpool up` (its PoolManager
reads the adapter from S3): a real PEFT adapter of the tiny llama pushed to the tenant's
own prefix and attached to a base with adapter slots, listed, refused by the field it
breaks (leaving no upload behind), and removed with the files its push uploaded."""
from __future__ import annotations

import json
import re

import pytest

from tests.cli.stack import api_tenant, ok_json, run_cli
from tests.support.peft_adapters import make_adapter

pytestmark = pytest.mark.timeout(400)
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def lora_tenant(stack, tiny_model, tmp_path_factory):
    """A tenant of its own (the workflow's tenant lists its uploads exactly), with the
    tiny llama pushed and deployed as `base` with two adapter slots."""
    tenant = api_tenant(stack, "lora-co", tmp_path_factory.mktemp("lora-configs"))
    ok_json(tenant.env, "models", "push", str(tiny_model), "tiny")
    ok_json(tenant.env, "deploy", "base", "--model", "tiny", "--engine", "max_loras=2")
    return tenant


def upload_names(env) -> list[str]:
    return sorted(u["name"] for u in ok_json(env, "models", "ls"))


def test_push_ls_rm(lora_tenant, tiny_model, tmp_path):
    env = lora_tenant.env
    folder = make_adapter(tiny_model, tmp_path / "support", 8, ALL, seed=1)
    (folder / "notes.txt").write_text("stays home")
    pushed = ok_json(env, "adapters", "push", str(folder), "--base", "base")
    assert (pushed["name"], pushed["base"], pushed["model"], pushed["rank"]) == \
        ("support", "base", "base:support", 8)
    assert pushed["target_modules"] == ALL and pushed["base_shared"] is False
    assert re.fullmatch(r"s3://[^/]+/tenants/[^/]+/support\.adapter/", pushed["adapter_uri"])
    assert pushed["weight_bytes"] == (folder / "adapter_model.safetensors").stat().st_size
    uploads = {u["name"]: u for u in ok_json(env, "models", "ls")}
    assert sorted(f["path"] for f in uploads["support.adapter"]["files"]) == \
        ["adapter_config.json", "adapter_model.safetensors"], "only the two PEFT files travel"

    assert ok_json(env, "adapters", "ls") == [pushed]
    table = run_cli(env, "adapters", "ls")
    assert table.returncode == 0 and "base:support" in table.stdout and "support" in table.stdout
    human = run_cli(env, "adapters", "push", str(folder), "--base", "base", "--name", "again")
    assert human.returncode == 0, human.stderr
    assert "attached again to base" in human.stdout and "base:again" in human.stdout

    assert ok_json(env, "adapters", "rm", "support") == {"deleted": "support", "upload": "support.adapter"}
    assert [a["name"] for a in ok_json(env, "adapters", "ls")] == ["again"]
    assert upload_names(env) == ["again.adapter", "tiny"]
    repushed = ok_json(env, "adapters", "push", str(folder), "--base", "base")   # its files were freed
    assert repushed["name"] == "support" and repushed["id"] != pushed["id"]
    for name in ("support", "again"):
        assert ok_json(env, "adapters", "rm", name)["upload"] == f"{name}.adapter"
    assert ok_json(env, "adapters", "ls") == [] and upload_names(env) == ["tiny"]


def test_refusals_leave_nothing_behind(lora_tenant, tiny_model, tmp_path):
    env = lora_tenant.env
    big = make_adapter(tiny_model, tmp_path / "big", 32, ["q_proj"], seed=2)
    refused = run_cli(env, "adapters", "push", str(big), "--base", "base")
    assert refused.returncode == 1
    assert re.fullmatch(r"thawpool: error: 422 invalid_field: r: rank 32 is above this base's "
                        r"max_lora_rank \(16\) \(request id \S+\)", refused.stderr.splitlines()[-1]), \
        refused.stderr
    nobase = run_cli(env, "adapters", "push", str(big), "--base", "no-such-base", "--json")
    assert nobase.returncode == 1 and json.loads(nobase.stderr.splitlines()[-1])["error"]["status"] == 404
    assert upload_names(env) == ["tiny"], "a refused attach keeps no upload"
    assert ok_json(env, "adapters", "ls") == []

    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "adapter_config.json").write_text("{}")
    half = run_cli(env, "adapters", "push", str(tmp_path / "half"), "--base", "base")
    assert half.returncode == 2 and "no adapter_model.safetensors" in half.stderr
    assert run_cli(env, "adapters", "push", str(big)).returncode == 2          # --base is required
    missing = run_cli(env, "adapters", "rm", "nothing-here")
    assert missing.returncode == 1 and "404 adapter_not_found" in missing.stderr
