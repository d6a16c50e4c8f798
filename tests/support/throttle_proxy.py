"""A TCP proxy on loopback that caps each connection's bandwidth, as real S3 does.

AWS S3 serves one connection at roughly 50-100 MB/s however fast the network is,
which is why clients that open many connections with ranged GETs beat one stream.
SeaweedFS on loopback has no such cap, so in front of it this proxy gives every
accepted connection a token bucket per direction (tests/support/pacing.py) at
`rate_bytes_per_s`, and can hold each answer's first byte `first_byte_latency_s`
(an answer starts when the server speaks after the client last did: HTTP/1.1
without pipelining, which is how botocore and aiohttp talk).

    with ThrottleProxy(s3.port, rate_bytes_per_s=80 * MB) as proxy:
        throttled = through(proxy, s3)         # an EmbeddedS3 whose endpoint is the proxy
        throttled.client().get_object(...), PoolSettings(s3_endpoint=proxy.endpoint, ...)
        proxy.stats.connections, proxy.stats.bytes_down

The proxy runs its own event loop in a thread, so synchronous code (boto3) and
another event loop (aiobotocore, pytest-asyncio) can both use it; a benchmark runs it
in a process of its own instead (tests/support/throttle_process.py), where its timing
does not wait on the client's GIL. It listens on 127.0.0.1 only, on a free port, and
forwards to 127.0.0.1 only. Pacing sleeps and reads 256 KiB at a time, so that the
proxy costs little CPU next to the client.
"""
from __future__ import annotations

import asyncio
import copy
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Protocol

from tests.support.pacing import TokenBucket

if TYPE_CHECKING:
    from controlplane.embedded import EmbeddedS3

HOST = "127.0.0.1"
READ_SIZE = 256 * 1024


@dataclass
class ProxyStats:
    """Counted on the proxy's loop; read from any thread (each field is one int)."""
    connections: int = 0      # accepted since start
    open: int = 0
    peak_open: int = 0        # most connections open at once
    bytes_up: int = 0         # client -> server
    bytes_down: int = 0       # server -> client

    def opened(self) -> None:
        self.connections += 1
        self.open += 1
        self.peak_open = max(self.peak_open, self.open)


@dataclass
class _Exchange:
    """One connection's request/answer turn, for the first-byte latency."""
    client_spoke: bool = False


class ThrottleProxy:
    def __init__(self, upstream_port: int, rate_bytes_per_s: float, *,
                 first_byte_latency_s: float = 0.0, read_size: int = READ_SIZE) -> None:
        self.upstream_port = upstream_port
        self.rate = rate_bytes_per_s
        self.first_byte_latency_s = first_byte_latency_s
        self.read_size = read_size
        self.port: Optional[int] = None
        self.stats = ProxyStats()
        self._thread: Optional[threading.Thread] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stopping: Optional[asyncio.Event] = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> "ThrottleProxy":
        listening: Future[int] = Future()
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(listening),),
                                        name=f"throttle-proxy-{self.upstream_port}", daemon=True)
        self._thread.start()
        self.port = listening.result(timeout=timeout_s)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        thread.join(timeout_s)

    def __enter__(self) -> "ThrottleProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _serve(self, listening: Future[int]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        try:
            server = await asyncio.start_server(self._handle, HOST, 0, limit=self.read_size)
        except BaseException as exc:
            listening.set_exception(exc)
            raise
        listening.set_result(server.sockets[0].getsockname()[1])
        await self._stopping.wait()
        server.close()
        # Open connections end with the proxy: aborted, so that their pumps see the end
        # and return (a cancelled handler is logged as an error by Python 3.11's streams).
        for writer in self._writers:
            writer.transport.abort()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await server.wait_closed()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(client_w)
        self.stats.opened()
        try:
            server_r, server_w = await asyncio.open_connection(HOST, self.upstream_port, limit=self.read_size)
            self._writers.add(server_w)
            try:
                await self._relay(client_r, client_w, server_r, server_w)
            finally:
                server_w.close()
                self._writers.discard(server_w)
        except OSError:                          # either side reset or refused: the connection ends
            pass
        finally:
            client_w.close()
            self._writers.discard(client_w)
            self.stats.open -= 1
            self._handlers.discard(task)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter,
                     server_r: asyncio.StreamReader, server_w: asyncio.StreamWriter) -> None:
        """Both directions at once. The client's EOF is passed on and the server may still
        answer; the server's end, or either side failing, ends the connection."""
        exchange = _Exchange()
        up = asyncio.ensure_future(self._pump(client_r, server_w, exchange, upstream=True))
        down = asyncio.ensure_future(self._pump(server_r, client_w, exchange, upstream=False))
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            if up.done() and up.exception() is None:
                await asyncio.wait({down})
        finally:
            up.cancel()
            down.cancel()
            ended = await asyncio.gather(up, down, return_exceptions=True)
        for outcome in ended:                    # a reset is how connections end; anything else is a bug
            if isinstance(outcome, Exception) and not isinstance(outcome, OSError):
                raise outcome

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    exchange: _Exchange, upstream: bool) -> None:
        loop = asyncio.get_running_loop()
        bucket = TokenBucket(self.rate, self.read_size, loop.time())
        while data := await reader.read(self.read_size):
            if upstream:
                exchange.client_spoke = True
            elif exchange.client_spoke and self.first_byte_latency_s > 0:
                exchange.client_spoke = False
                await asyncio.sleep(self.first_byte_latency_s)
            wait_s = bucket.reserve(len(data), loop.time())
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            writer.write(data)
            await writer.drain()
            self._count(len(data), upstream)
        if writer.can_write_eof():              # pass the half-close on: the other side may still answer
            writer.write_eof()

    def _count(self, nbytes: int, upstream: bool) -> None:
        if upstream:
            self.stats.bytes_up += nbytes
        else:
            self.stats.bytes_down += nbytes


class Listening(Protocol):
    port: Optional[int]


def through(proxy: Listening, s3: "EmbeddedS3") -> "EmbeddedS3":
    """`s3` as a client sees it through `proxy`: endpoint, client() and env() name the
    proxy. A view only: its stop() does nothing, the server stays the caller's."""
    view = copy.copy(s3)
    view.port = proxy.port
    view.process = None
    return view
