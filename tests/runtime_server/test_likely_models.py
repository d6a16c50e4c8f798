"""/admin/likely: a standby told the models it will likely load parses their tokenizers
ahead, and its /admin/load serves with the parse of the same files, or parses a file
changed since again. Real `--standby` replica processes over the tiny model.

To tell the two apart from outside, tokenizer.json is rewritten after the parse ahead into
one that counts a prompt's tokens differently (a Lowercase normalizer) and pads to the
same size: with its mtime put back, the file's identity is unchanged and the replica must
serve the tokenizer it parsed ahead; touched, it must parse the new one."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from runtime.core.tokenizer import Tokenizer
from tests.runtime_server.conftest import START_TIMEOUT_S, start_server

SECRET = "test-likely-secret-0123456789abcdef"
PROMPT = "HELLO WORLD, THE QUICK BROWN FOX"


def lowercasing(tokenizer_json: Path) -> bytes:
    """The same tokenizer with a Lowercase normalizer, compact JSON padded with spaces to
    the file's own size."""
    original = tokenizer_json.read_bytes()
    spec = json.loads(original)
    spec["normalizer"] = {"type": "Lowercase"}
    compact = json.dumps(spec, ensure_ascii=False, separators=(",", ":")).encode()
    assert len(compact) < len(original)
    return compact + b" " * (len(original) - len(compact))


@pytest.fixture
def model_copy(tiny_model, tmp_path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    return folder


@pytest.fixture
def standby(tmp_path):
    proc = start_server(["--standby"], tmp_path / "server.log", env={"THAWPOOL_REPLICA_SECRET": SECRET})
    try:
        proc.wait_health({"standby"})
        yield proc
    finally:
        proc.stop()


def prepared(client: httpx.Client, folder: Path) -> None:
    """Until the standby lists the folder's tokenizer as parsed."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while str(folder) not in client.get("/admin/likely").json()["models"]:
        assert time.monotonic() < deadline, "the tokenizer was never parsed ahead"
        time.sleep(0.05)


@pytest.mark.parametrize("touched", [False, True], ids=["same-file", "changed-file"])
def test_load_serves_the_tokenizer_parsed_ahead_unless_the_file_changed(standby, model_copy, tmp_path, touched):
    tokenizer_json = model_copy / "tokenizer.json"
    changed = tmp_path / "changed"
    shutil.copytree(model_copy, changed)
    (changed / "tokenizer.json").write_bytes(lowercasing(tokenizer_json))
    before, after = len(Tokenizer(model_copy).encode(PROMPT)), len(Tokenizer(changed).encode(PROMPT))
    assert before != after                       # the two files count the prompt apart

    with httpx.Client(base_url=standby.base_url, timeout=60, headers=standby.headers) as c:
        told = c.post("/admin/likely", json={"models": [str(model_copy)]})
        assert told.status_code == 202
        prepared(c, model_copy)
        st = tokenizer_json.stat()
        tokenizer_json.write_bytes((changed / "tokenizer.json").read_bytes())    # in place: same inode
        mtime_ns = st.st_mtime_ns + (1_000_000 if touched else 0)
        os.utime(tokenizer_json, ns=(st.st_atime_ns, mtime_ns))
        load = {"model": str(model_copy), "served_model_name": "told",
                "engine": {"kv_cache_tokens": 256, "block_size": 16}}
        assert c.post("/admin/load", json=load).status_code == 202
        standby.wait_health({"ready"})
        done = c.post("/v1/completions", json={"model": "told", "prompt": PROMPT, "max_tokens": 1})
        assert done.status_code == 200
        assert done.json()["usage"]["prompt_tokens"] == (after if touched else before)
        # a replica that loads prepares nothing more
        again = c.post("/admin/likely", json={"models": [str(model_copy)]})
        assert again.status_code == 409
        assert c.get("/admin/likely").json() == {"models": []}


def test_likely_models_refused_naming_the_field_and_without_the_secret(standby):
    refused = httpx.post(f"{standby.base_url}/admin/likely", json={"models": []}, timeout=10)
    assert refused.status_code == 401
    with httpx.Client(base_url=standby.base_url, timeout=60, headers=standby.headers) as c:
        bad = c.post("/admin/likely", json={"models": ["/m"] * 2 + [7]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "models"
        # a folder that is not there parses nothing and fails nothing: a wrong guess is free
        told = c.post("/admin/likely", json={"models": ["/nonexistent/model"]})
        assert told.status_code == 202
        assert c.get("/health").json() == {"status": "standby"}
