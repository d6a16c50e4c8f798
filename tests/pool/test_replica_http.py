"""The pool's and the gateway's clients to replicas over a unix socket (a sandboxed
replica has no network) and over TCP, against a real uvicorn server on each."""
from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import AsyncIterator

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from controlplane.gateway.upstream import Upstream
from pool.processes import free_port
from pool.replica_http import MAX_ANSWER_BYTES, ReplicaBodyTooLarge, replica_client
from wire.replica_address import ReplicaAddress, address_of, unix_base_url

async_test = pytest.mark.asyncio(loop_scope="function")


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ready", "path": request.url.path})


async def huge(request: Request) -> Response:
    return Response(b"x" * (MAX_ANSWER_BYTES + 1))


async def echo(request: Request) -> Response:
    return JSONResponse({"got": await request.json()})


APP = Starlette(routes=[Route("/health", health), Route("/huge", huge), Route("/invoke", echo, methods=["POST"])])


@contextlib.asynccontextmanager
async def serving(**where: object) -> AsyncIterator[None]:
    server = uvicorn.Server(uvicorn.Config(APP, log_level="warning", **where))  # type: ignore[arg-type]
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield
    finally:
        server.should_exit = True
        await task


def test_a_unix_base_url_names_its_socket_whatever_its_case():
    path = "/var/Lib/Thawpool/replicas/r-1/http.sock"
    assert address_of(unix_base_url(path) + "/health") == ReplicaAddress("", 0, path)
    assert address_of("http://127.0.0.1:8001/v1/x") == ReplicaAddress("127.0.0.1", 8001)
    with pytest.raises(ValueError):
        address_of("https://example.org/")


@async_test
async def test_the_pools_client_reaches_a_socket_and_a_port_and_caps_answers(tmp_path: Path):
    socket, port = str(tmp_path / "http.sock"), free_port()
    async with serving(uds=socket), serving(host="127.0.0.1", port=port):
        async with replica_client(httpx.Timeout(5.0)) as http:
            for base in (unix_base_url(socket), f"http://127.0.0.1:{port}"):
                answer = await http.get(f"{base}/health")
                assert answer.json() == {"status": "ready", "path": "/health"}
                with pytest.raises(ReplicaBodyTooLarge):
                    await http.get(f"{base}/huge")
        async with replica_client(httpx.Timeout(5.0)) as http:
            with pytest.raises(httpx.ConnectError):
                await http.get(f"{unix_base_url(str(tmp_path / 'gone.sock'))}/health")


@async_test
async def test_the_gateways_client_posts_over_a_socket(tmp_path: Path):
    socket = str(tmp_path / "http.sock")
    async with serving(uds=socket):
        async with Upstream(read_timeout_s=5.0) as upstream:
            answer = await upstream.post(f"{unix_base_url(socket)}/invoke", {"a": 1}, {})
            assert await answer.json() == {"got": {"a": 1}}
