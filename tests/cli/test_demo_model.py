"""The demo model (SmolLM2-135M-Instruct, one GGUF file: `make model` fetches it) through the
CLI path docs/cli.md gives a new user: push the file, deploy it under a new name, chat
with it, remove it, against a real `thawpool up`. Skipped where the file was never fetched
(a test never downloads it)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.real_model import CACHE, GGUF_MEMBER
from tests.cli.stack import api_tenant, ok_json, run_cli

pytestmark = [pytest.mark.timeout(400), pytest.mark.slow]
GGUF = CACHE / Path(GGUF_MEMBER).name


def test_the_demo_model_pushed_deployed_and_chatted_with(stack, tmp_path_factory):
    if not GGUF.is_file():
        pytest.skip(f"{GGUF} absent: `make model` fetches it")
    user = api_tenant(stack, "demo-user", tmp_path_factory.mktemp("demo-configs"))
    pushed = ok_json(user.env, "models", "push", str(GGUF), "smol")
    assert [f["path"] for f in pushed["files"]] == [GGUF.name]
    deployed = ok_json(user.env, "deploy", "smol-chat", "--model", "smol", "--max-replicas", "1",
                       "--idle-timeout", "60", "--engine", "kv_cache_tokens=512")
    revision = deployed["revisions"][0]
    assert revision["model_uri"] == pushed["model_uri"] + GGUF.name      # deployed as its file
    assert revision["architecture"] == "LlamaForCausalLM"                # read from its header
    try:
        chat = run_cli(user.env, "chat", "smol-chat", "--max-tokens", "8", "--temperature", "0",
                       "--json", stdin="What is the capital of France?\n")
        assert chat.returncode == 0, chat.stderr
        (turn,) = [json.loads(line) for line in chat.stdout.splitlines()]
        assert "Paris" in turn["content"], turn
        assert turn["usage"]["completion_tokens"] == 8
    finally:
        assert ok_json(user.env, "rm", "smol-chat") == {"deleted": "smol-chat"}
