"""The pool's upload of an adapter into a replica (pool/adapter_loads.py's `upload`), to a
replica that records what each PUT brought and what its inbox held at that moment.

With an inbox on the handle, the cached weights are hard-linked there (a copy, read-only
to all, where the link is refused), the PUT names the file with an empty body, and the
inbox is empty again after the reply, whatever the reply; without one, the weights are
the body. A cache entry or an inbox gone is a failed load, not a refused adapter."""
from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pool.adapter_loads import AdapterFiles, upload
from pool.api import AdapterLoadFailed, AdapterRefused
from tests.controlplane.support.servers import serve
from tests.support.live_handle import LiveHandle
from wire.replica_control import ADAPTER_CONFIG_HEADER, ADAPTER_FILE_HEADER, ADAPTERS_PATH, AdapterReply, adapter_file

pytestmark = pytest.mark.asyncio(loop_scope="session")
CONFIG = {"peft_type": "LORA", "r": 4, "target_modules": ["q_proj"]}
def Handle(replica_id: str, base_url: str, inbox: Optional[Path] = None) -> LiveHandle:   # noqa: N802
    """A live replica at `base_url`, with or without an adapter inbox, called with its secret."""
    return LiveHandle(replica_id, base_url, inbox, headers={"authorization": "Bearer s"})


WEIGHTS = b"\x10\x00\x00\x00\x00\x00\x00\x00" + b"{}" + bytes(range(256)) * 64




@dataclass
class Seen:
    headers: dict[str, str]
    body: bytes
    inbox: dict[str, tuple[bytes, int, int]]      # name -> (contents, inode, mode) during the PUT


def replica(inbox: Optional[Path], seen: list[Seen], status: int = 200) -> Starlette:
    async def put(request: Request) -> Response:
        held = {p.name: (p.read_bytes(), p.stat().st_ino, p.stat().st_mode & 0o777)
                for p in (inbox.iterdir() if inbox is not None else ())}
        seen.append(Seen(dict(request.headers), await request.body(), held))
        if status != 200:
            return JSONResponse({"error": {"message": "r: no"}}, status_code=status)
        return JSONResponse(AdapterReply(request.path_params["name"], True, 0.01).to_json())
    return Starlette(routes=[Route(ADAPTERS_PATH + "/{name}", put, methods=["PUT"])])


@pytest.fixture
def cached(tmp_path) -> AdapterFiles:
    """The adapter's weights as a cache entry holds them: read-only to all."""
    entry = tmp_path / "cache" / "objects" / "k" / "data"
    entry.parent.mkdir(parents=True)
    entry.write_bytes(WEIGHTS)
    entry.chmod(0o444)
    return AdapterFiles(json.dumps(CONFIG, indent=2).encode(), entry, len(WEIGHTS), 0, 0.0)


@pytest.fixture
def inbox(tmp_path) -> Path:
    folder = tmp_path / "cache" / "sandbox" / "models" / "model-r1" / "adapters"
    folder.mkdir(parents=True)
    return folder


async def test_with_an_inbox_the_weights_are_linked_named_and_unlinked_after_the_reply(cached, inbox):
    seen: list[Seen] = []
    async with serve(replica(inbox, seen)) as base, httpx.AsyncClient() as http:
        reply = await upload(http, Handle("r1", base, inbox), "support", cached, 10.0)
    assert reply == AdapterReply("support", True, 0.01)
    (put,) = seen
    name = put.headers[ADAPTER_FILE_HEADER]
    assert adapter_file(name) == name and put.body == b""
    assert json.loads(put.headers[ADAPTER_CONFIG_HEADER]) == CONFIG and put.headers["authorization"] == "Bearer s"
    assert list(put.inbox) == [name], "the inbox held this load's file, and only it"
    contents, inode, _ = put.inbox[name]
    assert contents == WEIGHTS and inode == cached.weights.stat().st_ino, "a hard link to the cache entry"
    assert list(inbox.iterdir()) == [] and cached.weights.read_bytes() == WEIGHTS, "the link went; the entry stays"


async def test_each_load_names_a_file_of_its_own(cached, inbox):
    seen: list[Seen] = []
    async with serve(replica(inbox, seen)) as base, httpx.AsyncClient() as http:
        for name in ("a", "b"):
            await upload(http, Handle("r1", base, inbox), name, cached, 10.0)
    assert len({s.headers[ADAPTER_FILE_HEADER] for s in seen}) == 2


async def test_where_the_link_is_refused_a_read_only_copy_goes_in_its_place(cached, inbox, monkeypatch):
    def refused(source: Any, target: Any) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", refused)
    seen: list[Seen] = []
    async with serve(replica(inbox, seen)) as base, httpx.AsyncClient() as http:
        await upload(http, Handle("r1", base, inbox), "support", cached, 10.0)
    contents, inode, mode = seen[0].inbox[seen[0].headers[ADAPTER_FILE_HEADER]]
    assert (contents, mode) == (WEIGHTS, 0o444) and inode != cached.weights.stat().st_ino
    assert list(inbox.iterdir()) == []


async def test_without_an_inbox_the_weights_are_the_body(cached):
    seen: list[Seen] = []
    async with serve(replica(None, seen)) as base, httpx.AsyncClient() as http:
        await upload(http, Handle("r1", base), "support", cached, 10.0)
    assert seen[0].body == WEIGHTS and ADAPTER_FILE_HEADER not in seen[0].headers


@pytest.mark.parametrize("status, error", [(400, AdapterRefused), (404, AdapterLoadFailed), (500, AdapterLoadFailed)])
async def test_a_refusal_leaves_the_inbox_empty_too(cached, inbox, status, error):
    seen: list[Seen] = []
    async with serve(replica(inbox, seen, status)) as base, httpx.AsyncClient() as http:
        with pytest.raises(error):
            await upload(http, Handle("r1", base, inbox), "support", cached, 10.0)
    assert len(seen[0].inbox) == 1 and list(inbox.iterdir()) == []


async def test_a_cache_entry_or_an_inbox_gone_is_a_failed_load_and_nothing_is_sent(cached, inbox, tmp_path):
    seen: list[Seen] = []
    gone = AdapterFiles(cached.config, tmp_path / "evicted", 1, 0, 0.0)
    async with serve(replica(inbox, seen)) as base, httpx.AsyncClient() as http:
        for files, folder in ((gone, inbox), (cached, tmp_path / "stopped" / "adapters")):
            with pytest.raises(AdapterLoadFailed, match="inbox"):
                await upload(http, Handle("r1", base, folder), "support", files, 10.0)
    assert seen == [] and not (tmp_path / "stopped").exists(), "no inbox of a stopped replica made again"
