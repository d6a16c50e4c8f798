"""LoRA adapters loaded into a running replica over HTTP (/admin/adapters) and served by name.

One replica with two adapter slots and a secret, as the pool starts one; adapters made
with peft on the tiny Llama. A completion whose `model` names an adapter gives
transformers + peft's greedy tokens with that adapter, the base name still the base's; a
load while a stream runs leaves the stream whole; every refusal has its status and names
its field; an adapter in use is not unloaded. The replica has an adapter inbox, as the
pool's sandboxed replicas do: a PUT may name a file there in place of a body, and a name
that could reach anything but a regular file of that folder is refused."""
from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

import httpx
import pytest

from runtime.serve.adapters import AdapterRefused
from runtime.serve.model_host import ModelHost
from runtime.serve.server import _adapter_weights, _adapters, read_limited
from spec.lora_adapter import MAX_WEIGHTS_BYTES
from tests.runtime.exactness import prompts
from tests.runtime_server.conftest import SERVED_NAME, start_server
from tests.support.peft_adapters import ALL_MODULES, make_adapter, peft_greedy
from wire.replica_control import (ADAPTER_CONFIG_HEADER, ADAPTER_FILE_HEADER, ADAPTER_INBOX_FLAG, ADAPTERS_PATH,
                                  AdapterList, AdapterReply, HealthStatus)

pytest.importorskip("peft", reason="peft is not installed (pyproject's test extra pins it)")

SECRET = "test-adapter-secret-0123456789"
NEW_TOKENS = 12
# name -> rank, targets, seed
ADAPTERS = {"a0": (8, ALL_MODULES, 0), "a1": (4, ["q_proj", "v_proj"], 1), "a2": (16, ["gate_proj", "down_proj"], 2)}


@pytest.fixture(scope="module")
def adapter_server(tiny_model, tmp_path_factory, folders):
    """Started with the adapter "boot" (a1's files) given by --lora-modules; the names it
    listed when it became ready are its `listed_at_start`; its adapter inbox `inbox`."""
    tmp = tmp_path_factory.mktemp("adapter-server")
    inbox = tmp / "inbox"
    inbox.mkdir()
    proc = start_server(["--model", str(tiny_model), "--served-model-name", SERVED_NAME, "--kv-cache-tokens", "1024",
                         "--block-size", "16", "--max-loras", "2", "--max-lora-rank", "16",
                         "--lora-modules", f"boot={folders['a1']}", ADAPTER_INBOX_FLAG, str(inbox)],
                        tmp / "server.log", env={"THAWPOOL_REPLICA_SECRET": SECRET})
    proc.inbox = inbox
    try:
        proc.wait_health({"ready"})
        listed = httpx.get(f"{proc.base_url}{ADAPTERS_PATH}", headers=proc.headers, timeout=30).json()
        proc.listed_at_start = AdapterList.parse(listed).names
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def folders(tiny_model, tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("adapters")
    return {name: make_adapter(tiny_model, tmp / name, rank, targets, seed)
            for name, (rank, targets, seed) in ADAPTERS.items()}


@pytest.fixture
def admin(adapter_server):
    with httpx.Client(base_url=adapter_server.base_url, timeout=60,
                      headers={"Authorization": f"Bearer {SECRET}"}) as client:
        yield client


def files(folder: Path) -> tuple[str, bytes]:
    """adapter_config.json as the header carries it (compact ASCII JSON), and the weights."""
    config = json.dumps(json.loads((folder / "adapter_config.json").read_text()), separators=(",", ":"))
    return config, (folder / "adapter_model.safetensors").read_bytes()


def put(client: httpx.Client, name: str, config: str, weights: bytes) -> httpx.Response:
    return client.put(f"{ADAPTERS_PATH}/{name}", content=weights, headers={ADAPTER_CONFIG_HEADER: config})


def put_file(client: httpx.Client, name: str, config: str, file_name: str, body: bytes = b"") -> httpx.Response:
    """The PUT naming a file of the inbox, as the pool sends it."""
    return client.put(f"{ADAPTERS_PATH}/{name}", content=body,
                      headers={ADAPTER_CONFIG_HEADER: config, ADAPTER_FILE_HEADER: file_name})


def load(client: httpx.Client, name: str, folder: Path) -> AdapterReply:
    reply = put(client, name, *files(folder))
    assert reply.status_code == 200, reply.text
    return AdapterReply.parse(reply.json())


def unload_all(client: httpx.Client) -> None:
    for name in AdapterList.parse(client.get(ADAPTERS_PATH).json()).names:
        assert client.delete(f"{ADAPTERS_PATH}/{name}").status_code == 200


def greedy(client: httpx.Client, model: str, prompt: list[int], **extra) -> dict:
    reply = client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": NEW_TOKENS,
                                                 "temperature": 0, "ignore_eos": True, "logprobs": 0, **extra})
    assert reply.status_code == 200, reply.text
    return reply.json()


def per_token(tokenizer, ids: list[int]) -> list[str]:
    return [tokenizer.decode([t]) for t in ids]


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from runtime.core.tokenizer import Tokenizer

    return Tokenizer(str(tiny_model))


# ---------------------------------------------------------------- serving with adapters

def test_completions_under_two_loaded_adapters_match_peft_and_the_base_stays_the_base(
        admin, folders, tiny_model, tokenizer):
    unload_all(admin)
    for name in ("a0", "a1"):
        reply = load(admin, name, folders[name])
        assert reply.name == name and reply.loaded and reply.load_s is not None and reply.load_s > 0
    prompt = prompts(21, [11])[0]
    outputs = {}
    for model, folder in ((SERVED_NAME, None), ("a0", folders["a0"]), ("a1", folders["a1"])):
        want = peft_greedy(tiny_model, folder, prompt, NEW_TOKENS)
        got = greedy(admin, model, prompt)
        assert got["model"] == model
        choice = got["choices"][0]
        assert choice["logprobs"]["tokens"] == per_token(tokenizer, want), model
        assert choice["text"] == tokenizer.decode(want)
        outputs[model] = choice["text"]
    assert len(set(outputs.values())) == 3, "an adapter left the base's tokens as they were"


def test_samples_and_a_guided_regex_run_under_an_adapter(admin, folders, tiny_model, tokenizer):
    import re

    unload_all(admin)
    load(admin, "a2", folders["a2"])
    prompt = prompts(22, [9])[0]
    want = per_token(tokenizer, peft_greedy(tiny_model, folders["a2"], prompt, NEW_TOKENS))
    got = greedy(admin, "a2", prompt, n=2)
    assert [c["logprobs"]["tokens"] for c in got["choices"]] == [want, want]
    guided = admin.post("/v1/completions", json={"model": "a2", "prompt": "x", "max_tokens": 16,
                                                 "temperature": 1.0, "seed": 3,
                                                 "guided_regex": r"[a-f]{2,4}-[0-9]{3}"})
    assert guided.status_code == 200, guided.text
    assert re.fullmatch(r"[a-f]{2,4}-[0-9]{3}", guided.json()["choices"][0]["text"])


def test_a_load_while_a_stream_runs_leaves_the_stream_whole(admin, folders, tiny_model, tokenizer, adapter_server):
    unload_all(admin)
    load(admin, "a0", folders["a0"])
    prompt, length = prompts(23, [8])[0], 200
    want = tokenizer.decode(peft_greedy(tiny_model, folders["a0"], prompt, length))
    chunks: list[str] = []
    first = threading.Event()

    def stream() -> None:
        body = {"model": "a0", "prompt": prompt, "max_tokens": length, "temperature": 0, "ignore_eos": True,
                "stream": True}
        with httpx.Client(base_url=adapter_server.base_url, timeout=60, headers=admin.headers) as client:
            with client.stream("POST", "/v1/completions", json=body) as reply:
                for line in reply.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        chunks.append(json.loads(line[6:])["choices"][0]["text"])
                        first.set()
                    elif line == "data: [DONE]":
                        chunks.append("[DONE]")

    streaming = threading.Thread(target=stream)
    streaming.start()
    assert first.wait(30)
    reply = load(admin, "a1", folders["a1"])                # while the stream runs
    streaming.join(60)
    assert reply.loaded and chunks[-1] == "[DONE]", chunks[-3:]
    assert "".join(chunks[:-1]) == want


def test_an_adapter_in_use_is_not_unloaded_until_its_request_ends(admin, folders, adapter_server):
    unload_all(admin)
    load(admin, "a0", folders["a0"])
    body = {"model": "a0", "prompt": prompts(24, [6])[0], "max_tokens": 300, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=adapter_server.base_url, timeout=60, headers=admin.headers) as client:
        with client.stream("POST", "/v1/completions", json=body) as reply:
            lines = reply.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            refused = admin.delete(f"{ADAPTERS_PATH}/a0")
            assert refused.status_code == 409 and "in use" in refused.json()["error"]["message"]
            assert [line for line in lines if line.startswith("data: ")][-1] == "data: [DONE]"
    gone = admin.delete(f"{ADAPTERS_PATH}/a0")
    assert gone.status_code == 200 and AdapterReply.parse(gone.json()) == AdapterReply("a0", False)
    assert admin.delete(f"{ADAPTERS_PATH}/a0").status_code == 404
    unknown = admin.post("/v1/completions", json={"model": "a0", "prompt": "hi", "max_tokens": 2})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


def test_lora_modules_are_loaded_before_the_replica_is_ready(adapter_server):
    assert adapter_server.listed_at_start == ("boot",)


def test_lora_modules_are_refused_at_start_without_slots_or_with_a_bad_name(tmp_path):
    from runtime.serve.server import parse_settings

    for argv in (["--model", "m", "--lora-modules", "a=/x"],
                 ["--model", "m", "--max-loras", "1", "--lora-modules", "-a=/x"],
                 ["--model", "m", "--max-loras", "1", "--lora-modules", "a"],
                 ["--model", "m", ADAPTER_INBOX_FLAG, str(tmp_path / "absent")]):
        with pytest.raises(SystemExit):
            parse_settings(argv, env={})
    settings = parse_settings(["--model", "m", "--max-loras", "1", "--lora-modules", "a=/x", "b=/y=z"], env={})
    assert settings.lora_modules == (("a", "/x"), ("b", "/y=z"))
    assert parse_settings(["--model", "m", ADAPTER_INBOX_FLAG, str(tmp_path)], env={}).adapter_inbox == str(tmp_path)


def test_the_lists_name_what_is_loaded(admin, folders):
    unload_all(admin)
    assert AdapterList.parse(admin.get(ADAPTERS_PATH).json()).names == ()
    load(admin, "a1", folders["a1"])
    load(admin, "a2", folders["a2"])
    assert sorted(AdapterList.parse(admin.get(ADAPTERS_PATH).json()).names) == ["a1", "a2"]
    models = admin.get("/v1/models").json()["data"]
    assert models[0] == {"id": SERVED_NAME, "object": "model", "owned_by": "thawpool"}
    assert sorted(models[1:], key=lambda m: m["id"]) == [
        {"id": name, "object": "model", "owned_by": "thawpool", "parent": SERVED_NAME} for name in ("a1", "a2")]


def test_the_same_files_again_are_loaded_unchanged_and_other_files_are_refused(admin, folders):
    unload_all(admin)
    load(admin, "a1", folders["a1"])
    again = put(admin, "a1", *files(folders["a1"]))
    assert again.status_code == 200 and AdapterReply.parse(again.json()).loaded
    other = put(admin, "a1", *files(folders["a2"]))
    assert other.status_code == 409 and other.json()["error"]["param"] == "name"
    base = put(admin, SERVED_NAME, *files(folders["a2"]))
    assert base.status_code == 409, base.text
    assert AdapterList.parse(admin.get(ADAPTERS_PATH).json()).names == ("a1",)


def test_an_adapter_loads_from_a_file_its_put_names_in_the_inbox(admin, folders, adapter_server, tiny_model,
                                                                  tokenizer):
    unload_all(admin)
    config, _ = files(folders["a0"])
    linked = adapter_server.inbox / "0123abcd-adapter_model.safetensors"
    os.link(folders["a0"] / "adapter_model.safetensors", linked)
    try:
        reply = put_file(admin, "a0", config, linked.name)
    finally:
        linked.unlink()
    assert reply.status_code == 200, reply.text
    assert AdapterReply.parse(reply.json()).loaded
    prompt = prompts(25, [7])[0]
    want = per_token(tokenizer, peft_greedy(tiny_model, folders["a0"], prompt, NEW_TOKENS))
    assert greedy(admin, "a0", prompt)["choices"][0]["logprobs"]["tokens"] == want, "read after its link went"
    again = put(admin, "a0", *files(folders["a0"]))
    assert again.status_code == 200, "the body of the same file is the same adapter (its digest)"
    assert AdapterList.parse(admin.get(ADAPTERS_PATH).json()).names == ("a0",)


@pytest.mark.parametrize("file_name", ["../adapter_model.safetensors", "a/b", "/etc/passwd", ".hidden", "..", ""])
def test_an_inbox_file_name_that_could_leave_the_folder_is_refused_naming_the_header(admin, folders, file_name):
    config, _ = files(folders["a0"])
    reply = put_file(admin, "escape", config, file_name)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == ADAPTER_FILE_HEADER, reply.text
    assert "escape" not in AdapterList.parse(admin.get(ADAPTERS_PATH).json()).names


def test_a_symlink_a_folder_or_a_fifo_in_the_inbox_is_refused_and_a_missing_file_is_404(
        admin, folders, adapter_server, tmp_path):
    config, _ = files(folders["a0"])
    inbox = adapter_server.inbox
    outside = tmp_path / "secret.safetensors"
    outside.write_bytes((folders["a0"] / "adapter_model.safetensors").read_bytes())
    (inbox / "link.safetensors").symlink_to(outside)
    (inbox / "folder").mkdir()
    os.mkfifo(inbox / "fifo")          # opened without O_NONBLOCK, a FIFO would hang the replica
    try:
        link = put_file(admin, "planted", config, "link.safetensors")
        assert link.status_code == 400 and "symbolic link" in link.json()["error"]["message"], link.text
        for name in ("folder", "fifo"):
            other = put_file(admin, "planted", config, name)
            assert other.status_code == 400 and "not a regular file" in other.json()["error"]["message"], other.text
        missing = put_file(admin, "planted", config, "gone.safetensors")
        assert missing.status_code == 404, missing.text
        for reply in (link, other, missing):
            assert reply.json()["error"]["param"] == ADAPTER_FILE_HEADER
    finally:
        for name in ("link.safetensors", "fifo"):
            (inbox / name).unlink()
        (inbox / "folder").rmdir()
    assert "planted" not in AdapterList.parse(admin.get(ADAPTERS_PATH).json()).names


def test_a_file_of_the_inbox_is_checked_as_a_body_is_and_a_body_beside_a_name_refused(
        admin, folders, adapter_server):
    config, weights = files(folders["a0"])
    cut = adapter_server.inbox / "cut.safetensors"
    empty = adapter_server.inbox / "empty.safetensors"
    cut.write_bytes(weights[:-8])
    empty.write_bytes(b"")
    try:
        for name in (cut.name, empty.name):
            reply = put_file(admin, "cut", config, name)
            assert reply.status_code == 400 and reply.json()["error"]["param"] == "adapter_model.safetensors", \
                reply.text
        both = put_file(admin, "cut", config, cut.name, body=weights)
        assert both.status_code == 400 and both.json()["error"]["param"] == "body", both.text
    finally:
        cut.unlink()
        empty.unlink()


# ---------------------------------------------------------------- refusals

def _edited(folder: Path, **changes) -> tuple[str, bytes]:
    config, weights = files(folder)
    return json.dumps({**json.loads(config), **changes}, separators=(",", ":")), weights


@pytest.mark.parametrize("changes, field", [
    ({"use_dora": True}, "use_dora"), ({"r": 32}, "r"), ({"bias": "all"}, "bias"),
    ({"target_modules": ["q_proj", "lm_head"]}, "target_modules")])
def test_a_setting_the_engine_cannot_apply_is_refused_naming_it(admin, folders, changes, field):
    reply = put(admin, "bad", *_edited(folders["a0"], **changes))
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == field and error["message"].startswith(f"{field}: ")
    assert "bad" not in AdapterList.parse(admin.get(ADAPTERS_PATH).json()).names


def test_a_rank_above_the_slots_is_refused(admin, tiny_model, tmp_path):
    """r 32 with files of that rank: the slots hold rank 16 at most."""
    reply = put(admin, "wide", *files(make_adapter(tiny_model, tmp_path / "r32", 32, ["q_proj"], seed=5)))
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "r", reply.text


def test_weights_of_another_base_and_broken_files_are_refused(admin, folders, model_factory, tmp_path):
    other = make_adapter(model_factory(arch="llama", hidden_size=96, intermediate_size=192), tmp_path / "other",
                         8, ALL_MODULES, seed=0)
    reply = put(admin, "other", *files(other))
    assert reply.status_code == 400 and "another base model" in reply.json()["error"]["message"]
    assert reply.json()["error"]["param"] == "adapter_model.safetensors"
    config, weights = files(folders["a0"])
    for broken in (weights[:-8], weights[:100], b""):
        cut = put(admin, "cut", config, broken)
        assert cut.status_code == 400 and cut.json()["error"]["param"] == "adapter_model.safetensors", cut.text
    not_json = put(admin, "cut", "{r:8", weights)
    assert not_json.status_code == 400 and not_json.json()["error"]["param"] == "adapter_config.json"


def test_a_bad_name_and_a_missing_config_header_are_refused(admin, folders):
    config, weights = files(folders["a0"])
    for name in ("-lead", "a" * 65, "sp ace", "dot:colon"):
        reply = put(admin, name, config, weights)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "name", (name, reply.text)
    missing = admin.put(f"{ADAPTERS_PATH}/a0", content=weights)
    assert missing.status_code == 400 and missing.json()["error"]["param"] == ADAPTER_CONFIG_HEADER


def test_without_the_secret_every_adapter_path_is_refused(adapter_server, folders):
    config, weights = files(folders["a0"])
    with httpx.Client(base_url=adapter_server.base_url, timeout=60) as stranger:
        for reply in (put(stranger, "a0", config, weights), stranger.get(ADAPTERS_PATH),
                      stranger.delete(f"{ADAPTERS_PATH}/a0")):
            assert reply.status_code == 401 and reply.json()["error"]["type"] == "authentication_error"


def test_a_body_declared_above_the_limit_is_refused_before_it_is_read(adapter_server, folders):
    config, _ = files(folders["a0"])
    host, port = adapter_server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(f"PUT {ADAPTERS_PATH}/huge HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {SECRET}\r\n"
                     f"{ADAPTER_CONFIG_HEADER}: {config}\r\nContent-Length: {MAX_WEIGHTS_BYTES + 1}\r\n\r\n".encode())
        answer = conn.recv(65536).decode()
    head, _, body = answer.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 413"), head
    assert json.loads(body)["error"]["param"] == "body"


def test_a_replica_without_adapter_slots_refuses_loads(server, folders):
    """The shared replica: max_loras 0."""
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        reply = put(client, "a0", *files(folders["a0"]))
    assert reply.status_code == 409 and reply.json()["error"]["param"] == "max_loras", reply.text


# ---------------------------------------------------------------- without a server

async def _chunks(*parts: bytes):
    for part in parts:
        yield part


@pytest.mark.asyncio
async def test_a_body_is_refused_as_soon_as_it_outgrows_the_limit():
    assert await read_limited(_chunks(b"ab", b"cd"), None, 4) == bytearray(b"abcd")
    assert await read_limited(_chunks(b"ab", b"cd"), "4", 4) == bytearray(b"abcd")
    taken: list[bytes] = []

    async def endless():
        while True:
            taken.append(b"x" * 3)
            yield taken[-1]

    with pytest.raises(AdapterRefused) as refused:
        await read_limited(endless(), None, 10)
    assert refused.value.status == 413 and len(taken) == 4      # refused at the 4th chunk, not later
    with pytest.raises(AdapterRefused):
        await read_limited(_chunks(b"ab"), "11", 10)                # on its Content-Length alone


@pytest.mark.asyncio
async def test_a_replica_without_an_inbox_refuses_a_named_file():
    """A standalone server (no --adapter-inbox) takes bodies only."""
    from starlette.applications import Starlette
    from starlette.requests import Request

    app = Starlette()
    app.state.adapter_inbox = None
    request = Request({"type": "http", "method": "PUT", "app": app, "path": f"{ADAPTERS_PATH}/a0",
                       "headers": [(ADAPTER_FILE_HEADER.encode(), b"w.safetensors")]})
    with pytest.raises(AdapterRefused) as refused:
        await _adapter_weights(request)
    assert (refused.value.status, refused.value.param) == (400, ADAPTER_FILE_HEADER)
    assert ADAPTER_INBOX_FLAG in refused.value.message


@pytest.mark.parametrize("status, answer", [
    (HealthStatus.LOADING, 503), (HealthStatus.WAKING, 503), (HealthStatus.SLEEPING, 409),
    (HealthStatus.STANDBY, 409), (HealthStatus.FAILED, 409)])
def test_a_model_not_ready_refuses_loads(status, answer):
    host = ModelHost()
    host.status = status
    with pytest.raises(AdapterRefused) as refused:
        _adapters(host)
    assert refused.value.status == answer
