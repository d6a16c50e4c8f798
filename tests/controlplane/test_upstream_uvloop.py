"""The gateway's hop to replicas on the event loop `thawpool up` runs (uvloop), whose
transports are not asyncio.Transport subclasses: a whole answer, and the connection
kept alive for the next call."""
import asyncio

import uvloop

from controlplane.gateway.upstream import Upstream


async def two_calls() -> tuple[list[bytes], int]:
    accepted = []

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            body = await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server, Upstream(read_timeout_s=5) as upstream:
        answers = [await (await upstream.post(f"{base}/v1/x", {"n": n}, {})).aread()
                   for n in (1, 2)]
        for writer in accepted:
            writer.close()
    return answers, len(accepted)


def test_the_hop_on_uvloop():
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        answers, connections = runner.run(two_calls())
    assert answers == [b'{"n": 1}', b'{"n": 2}'] and connections == 1
