"""The gateway's HTTP client for the hop to replicas (controlplane/gateway/upstream.py) against
real servers: uvicorn for well-behaved replicas, a raw asyncio server for answers that
break off, are malformed or stall."""
import asyncio
import json
from typing import Awaitable, Callable

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from controlplane.gateway.upstream import HIGH_WATER_BYTES, AnswerTooLarge, Upstream, UpstreamError
from tests.controlplane.support.servers import serve
from tests.support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

LONG_LINE = "x" * 200_000          # past any line-length cap a stream reader might have


async def echo(request: Request) -> JSONResponse:
    return JSONResponse({"body": await request.json(), "port": request.client.port,
                         "request_id": request.headers.get("x-request-id"),
                         "content_type": request.headers.get("content-type")},
                        status_code=int(request.query_params.get("status", "200")))


async def stream(request: Request) -> StreamingResponse:
    async def lines():
        for i in range(3):
            yield f"data: {i}\n\n".encode()
            await asyncio.sleep(0.01)
        yield f"data: {LONG_LINE}\r\n\r\n".encode()
        yield b"data: [DONE]\n\n"
    return StreamingResponse(lines(), media_type="text/event-stream")


async def big(request: Request) -> StreamingResponse:
    async def parts():
        for i in range(12):                       # 3 MiB in 256 KiB parts, chunked
            yield bytes([65 + i]) * (1 << 18)
    return StreamingResponse(parts())


async def endless(request: Request) -> StreamingResponse:
    async def parts():
        while True:
            yield b"data: more\n\n"
            await asyncio.sleep(0.01)
    return StreamingResponse(parts(), media_type="text/event-stream")


REPLICA = Starlette(routes=[Route("/echo", echo, methods=["POST"]),
                            Route("/stream", stream, methods=["POST"]),
                            Route("/big", big, methods=["POST"]),
                            Route("/endless", endless, methods=["POST"])])

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def raw_server(handler: Handler) -> tuple[asyncio.AbstractServer, str]:
    """A server that answers whatever bytes `handler` writes, after reading the request."""
    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            await handler(reader, writer)
        finally:
            writer.close()
    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def test_a_whole_answer_its_status_and_the_headers_sent():
    async with serve(REPLICA) as base, Upstream(read_timeout_s=5) as upstream:
        answer = await upstream.post(f"{base}/echo?status=201", {"prompt": "hé"}, {"x-request-id": "r-1"})
        assert answer.status_code == 201
        seen = await answer.json()
        assert (seen["body"], seen["request_id"], seen["content_type"]) == (
            {"prompt": "hé"}, "r-1", "application/json")


async def test_a_connection_is_kept_alive_only_after_a_whole_answer():
    async with serve(REPLICA) as base, Upstream(read_timeout_s=5) as upstream:
        first = await (await upstream.post(f"{base}/echo", {}, {})).json()
        second = await (await upstream.post(f"{base}/echo", {}, {})).json()
        assert first["port"] == second["port"]            # the same connection
        cut = await upstream.post(f"{base}/endless", {}, {})
        async for line in cut.aiter_lines():
            if line:
                break
        await cut.aclose()                                  # left unfinished: closed
        third = await (await upstream.post(f"{base}/echo", {}, {})).json()
        assert third["port"] != second["port"]


async def test_a_streams_lines_arrive_whole_however_long():
    async with serve(REPLICA) as base, Upstream(read_timeout_s=5) as upstream:
        answer = await upstream.post(f"{base}/stream", {}, {})
        lines = [line async for line in answer.aiter_lines() if line]
        assert lines == ["data: 0", "data: 1", "data: 2", f"data: {LONG_LINE}", "data: [DONE]"]


async def test_a_body_past_the_high_water_mark_is_read_whole():
    async with serve(REPLICA) as base, Upstream(read_timeout_s=5) as upstream:
        answer = await upstream.post(f"{base}/big", {}, {})
        await eventually(lambda: answer._connection.paused, timeout_s=5,
                         what="the buffer past the high-water mark: reading paused")
        body = await answer.aread()
        assert len(body) == 12 * (1 << 18) > HIGH_WATER_BYTES
        assert body == b"".join(bytes([65 + i]) * (1 << 18) for i in range(12))
        again = await upstream.post(f"{base}/echo", {"after": "big"}, {})
        assert (await again.json())["body"] == {"after": "big"}


@pytest.mark.parametrize("reply, hold_s, kind", [
    (b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b"{" * 10, 0, "AnswerCut"),
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", 1, "MalformedAnswer"),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n", 5, "TimeoutError"),
], ids=["cut mid-body", "not http", "stalled past the read timeout"])
async def test_a_broken_answer_is_an_upstream_error(reply, hold_s, kind):
    async def answer(reader, writer):
        writer.write(reply)
        await writer.drain()
        await asyncio.sleep(hold_s)         # then the connection closes
    server, base = await raw_server(answer)
    async with server, Upstream(read_timeout_s=0.3) as upstream:
        with pytest.raises(UpstreamError) as failure:
            await (await upstream.post(f"{base}/v1/completions", {}, {})).aread()
        assert failure.value.kind == kind


async def test_a_replica_that_is_not_there_is_an_upstream_error():
    server, base = await raw_server(lambda reader, writer: asyncio.sleep(0))
    server.close()
    await server.wait_closed()
    async with Upstream(read_timeout_s=5) as upstream:
        with pytest.raises(UpstreamError) as failure:
            await upstream.post(f"{base}/v1/completions", {}, {})
        assert failure.value.kind == "ConnectionRefusedError"


async def test_a_connection_the_replica_closed_while_idle_is_not_reused():
    connections = []

    async def answer_then_close(reader, writer):
        connections.append(writer)
        body = json.dumps({"n": len(connections)}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()                # then closed, though HTTP/1.1 keeps it alive
    server, base = await raw_server(answer_then_close)
    async with server, Upstream(read_timeout_s=5) as upstream:
        assert await (await upstream.post(f"{base}/a", {}, {})).json() == {"n": 1}
        await eventually(lambda: upstream.connections == 0, timeout_s=5, what="the close seen")
        assert await (await upstream.post(f"{base}/a", {}, {})).json() == {"n": 2}


async def test_a_header_that_would_split_the_request_is_refused():
    async with Upstream(read_timeout_s=5) as upstream:
        with pytest.raises(ValueError, match="single line"):
            await upstream.post("http://127.0.0.1:9/x", {}, {"x-request-id": "a\r\nevil: 1"})


async def test_connections_beyond_the_limit_wait_for_a_free_one():
    async with serve(REPLICA) as base, Upstream(read_timeout_s=5, max_connections=1) as upstream:
        held = await upstream.post(f"{base}/endless", {}, {})
        waiting = asyncio.ensure_future(upstream.post(f"{base}/echo", {"n": 2}, {}))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await held.aclose()
        assert (await (await waiting).json())["body"] == {"n": 2}


async def test_a_body_already_whole_is_handed_over_without_waiting():
    async with serve(REPLICA) as base, Upstream(read_timeout_s=5) as upstream:
        answer = await upstream.post(f"{base}/echo", {"n": 1}, {})
        await eventually(lambda: answer._exchange.complete, timeout_s=5, what="the rest of the answer")
        first = json.loads(answer.whole_body())
        assert first["body"] == {"n": 1}
        again = await (await upstream.post(f"{base}/echo", {}, {})).json()
        assert again["port"] == first["port"]         # the connection went back to the pool
        endless = await upstream.post(f"{base}/endless", {}, {})
        await asyncio.sleep(0.05)
        assert endless.whole_body() is None           # more to come: read it as a stream
        await endless.aclose()


async def endless_body(reader, writer, *, line_end: bytes = b"") -> int:
    """A 2 GB answer declared, sent in 64 KiB parts until the reader hangs up; the bytes
    it got out before that."""
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (2 << 30))
    sent, part = 0, b"x" * (1 << 16) + line_end
    try:
        while sent < 2 << 30:
            writer.write(part)
            await writer.drain()
            sent += len(part)
    except ConnectionError:
        pass
    return sent


async def test_an_answer_past_the_cap_is_refused_before_it_ends():
    """A replica's 2 GB answer: refused once past the cap, its connection closed, the rest
    never read (the replica's writes fail soon after)."""
    sent: list[int] = []

    async def huge(reader, writer):
        sent.append(await endless_body(reader, writer))
    server, base = await raw_server(huge)
    async with server, Upstream(read_timeout_s=5, max_answer_bytes=1 << 20) as upstream:
        answer = await upstream.post(f"{base}/invoke", {}, {})
        with pytest.raises(AnswerTooLarge) as refused:
            await answer.aread()
        assert refused.value.kind == "AnswerTooLarge" and "1048576 bytes" in refused.value.message
        await eventually(lambda: upstream.connections == 0, timeout_s=5, what="the connection closed")
        await eventually(lambda: sent, timeout_s=10, what="the replica's writes to fail")
        assert sent[0] < 64 << 20, "the rest of the answer is not read"


async def test_a_whole_answer_past_the_cap_is_refused():
    async with serve(REPLICA) as base, Upstream(read_timeout_s=5, max_answer_bytes=1000) as upstream:
        answer = await upstream.post(f"{base}/echo", {"pad": "x" * 2000}, {})
        await eventually(lambda: answer._exchange.complete, timeout_s=5, what="all of the answer")
        with pytest.raises(AnswerTooLarge):
            answer.whole_body()
        assert (await (await upstream.post(f"{base}/echo", {}, {})).json())["body"] == {}


async def test_a_stream_line_past_the_cap_is_refused_and_a_long_stream_is_not():
    sent: list[int] = []

    async def one_endless_line(reader, writer):
        sent.append(await endless_body(reader, writer))
    server, base = await raw_server(one_endless_line)
    async with server, Upstream(read_timeout_s=5, max_answer_bytes=1 << 20,
                                max_line_bytes=1 << 20) as upstream:
        answer = await upstream.post(f"{base}/v1/completions", {}, {})
        with pytest.raises(AnswerTooLarge, match="stream line"):
            async for _ in answer.aiter_lines():
                pass
        await eventually(lambda: sent, timeout_s=10, what="the replica's writes to fail")
        assert sent[0] < 64 << 20

    async def many_lines(reader, writer):
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (4 * (1 << 16) * 33))
        for _ in range(4 * 33):        # 4 MiB of lines, each under the cap
            writer.write(b"x" * ((1 << 16) - 1) + b"\n")
        await writer.drain()
    server, base = await raw_server(many_lines)
    async with server, Upstream(read_timeout_s=5, max_line_bytes=1 << 20) as upstream:
        answer = await upstream.post(f"{base}/v1/completions", {}, {})
        lines = [line async for line in answer.aiter_lines()]
        assert len(lines) == 4 * 33 and all(len(line) == (1 << 16) - 1 for line in lines)
