"""A TCP port carried to a unix socket, and the small asyncio server it runs on.

A sandboxed process has no network (pool/sandbox.py): what it serves, or reaches,
is a unix socket. Two places carry a TCP port to one:

  - a Ray node: a sandboxed replica listens on its socket; its actor (the platform's
    code) listens on a port of the node, since the pool may run on another machine;
  - a sandboxed venv build: the installer (runtime/functions/env.py) gives pip a
    loopback port of the sandbox that leads to the pool's egress proxy (pool/egress.py).

Each connection is piped both ways until either side closes. The server runs on an
event loop in a thread of its own, so a blocking caller (a Ray actor, the installer)
can use it.
"""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Awaitable, Callable, Optional

CHUNK_BYTES = 1 << 16
# a sandboxed function server's way out, where its tenant was granted one: the unix
# socket of the pool's egress proxy (pool/egress.py) as the server sees it
EGRESS_SOCKET_ENV = "THAWPOOL_EGRESS_SOCKET"


class ThreadServer:
    """An asyncio server on a loop in a daemon thread."""

    def __init__(self) -> None:
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def run(self, make: Callable[[], Awaitable[asyncio.Server]]) -> asyncio.Server:
        """Starts the server `make()` opens; returns it once it listens."""
        loop = self._loop = asyncio.new_event_loop()
        listening: Future[asyncio.Server] = Future()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            try:
                server = loop.run_until_complete(make())
            except OSError as exc:
                listening.set_exception(exc)
                return
            listening.set_result(server)
            loop.run_forever()
            server.close()

        threading.Thread(target=serve, name="thread-server", daemon=True).start()
        return listening.result(timeout=30)

    def close(self) -> None:
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)


class SocketForward(ThreadServer):
    def __init__(self, host: str, socket: Path):
        super().__init__()
        self.host, self.socket = host, socket

    def start(self) -> int:
        """Listens on a free port of `host`; returns the port."""
        server = self.run(lambda: asyncio.start_server(self._serve, self.host, 0))
        port: int = server.sockets[0].getsockname()[1]
        return port

    async def _serve(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        try:
            target_in, target_out = await asyncio.open_unix_connection(str(self.socket))
        except OSError:                     # nothing listens there (yet, or any more)
            client_out.close()
            return
        await asyncio.gather(pipe(client_in, target_out), pipe(target_in, client_out))


async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Bytes from source to sink until source ends or either breaks; then sink is closed."""
    try:
        while data := await source.read(CHUNK_BYTES):
            sink.write(data)
            await sink.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        sink.close()
