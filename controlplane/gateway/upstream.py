"""The control plane's HTTP client for the hop to a replica: HTTP/1.1 over asyncio's
transports, parsed by httptools (llhttp, the C parser uvicorn uses), with kept-alive
connections per replica.

Every invocation crosses this hop twice (request out, answer back), so its CPU per
call is latency the gateway adds and caps how many calls per second one control-plane
process can pass: a call here is therefore one write of the request's bytes, the
parser's callbacks as the answer arrives, and one future per wait, none of the
per-request objects a general-purpose client builds (the clients tried before and
their cost: benchmarks/results/code_figures.md).

The gateway sees only `Upstream.post` and `UpstreamResponse` (status, the whole body,
or its lines as they arrive) and one error type, `UpstreamError`, for a replica that
cannot be reached, or whose answer broke off, was malformed or stalled past the read
timeout; its subclass `AnswerTooLarge` names an answer refused for its size.

A replica's answer is a tenant's output, so its size is capped as it is read: a whole
body (`aread`, `whole_body`) at `max_answer_bytes`, one line of a stream at
`max_line_bytes`. The answer is refused once the cap is passed, the rest never read
(the connection is closed), so memory holds at most the cap and the high-water mark.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Optional, cast
from urllib.parse import urlsplit

import httptools

from wire.keepalive import GATEWAY_KEEPALIVE_S
from wire.replica_address import ReplicaAddress, address_of

# an answer buffered past this stops being read until the gateway catches up (a slow
# client of a stream pushes back on the replica instead of filling our memory)
HIGH_WATER_BYTES = 1 << 20
LOW_WATER_BYTES = 1 << 18
# what one answer may weigh: a unary body, and one line (one SSE event) of a stream
MAX_ANSWER_BYTES = 32 << 20
MAX_LINE_BYTES = 8 << 20


class UpstreamError(Exception):
    """The replica could not be reached, or its answer broke off or timed out."""

    def __init__(self, cause: BaseException):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.kind = type(cause).__name__


class AnswerTooLarge(UpstreamError):
    """The replica's answer passed its size cap; the rest of it was not read."""

    def __init__(self, what: str, limit: int):
        super().__init__(ValueError(f"{what} passed the cap of {limit} bytes"))
        self.kind = "AnswerTooLarge"
        self.message = f"the replica's {what} passed the cap of {limit} bytes"


class AnswerCut(ConnectionError):
    """The replica closed the connection before its answer was whole."""


class MalformedAnswer(ValueError):
    """The replica's bytes are not an HTTP/1.1 response."""


class _Exchange:
    """One request's answer as the parser delivers it; the reader waits on `waiter`."""

    __slots__ = ("status", "headers_done", "complete", "keep_alive", "error", "chunks",
                 "buffered", "waiter")

    def __init__(self) -> None:
        self.status = 0
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.error: Optional[BaseException] = None
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.waiter: Optional[asyncio.Future[None]] = None

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def end(self, error: BaseException) -> None:
        """The answer ends with `error`, unless it already ended (whole, or failed)."""
        if not self.complete and self.error is None:
            self.error = error
            self.wake()


class _Connection(asyncio.Protocol):
    """A kept-alive connection to one replica, carrying one exchange at a time."""

    def __init__(self, key: ReplicaAddress, on_lost: Callable[["_Connection"], None]) -> None:
        self.key, self.on_lost = key, on_lost
        self.transport: Optional[asyncio.Transport] = None
        self.parser = httptools.HttpResponseParser(self)
        self.exchange: Optional[_Exchange] = None
        self.closed = False
        self.paused = False
        self.idle_since = 0.0

    # ------------------------------------------------------------- transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, though they are one
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange is None or exchange.complete:      # bytes nobody asked for: unusable
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(MalformedAnswer(str(exc)))

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self.closed = True
        if self.exchange is not None:
            self.exchange.end(exc or AnswerCut("the replica closed the connection mid-answer"))
        self.on_lost(self)

    # ------------------------------------------------------------- parser callbacks

    def on_headers_complete(self) -> None:
        exchange = self.exchange
        assert exchange is not None
        exchange.status = self.parser.get_status_code()
        exchange.headers_done = True
        exchange.wake()

    def on_body(self, body: bytes) -> None:
        exchange = self.exchange
        assert exchange is not None
        exchange.chunks.append(body)
        exchange.buffered += len(body)
        if exchange.buffered > HIGH_WATER_BYTES and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        exchange.wake()

    def on_message_complete(self) -> None:
        exchange = self.exchange
        assert exchange is not None
        exchange.complete = True
        exchange.keep_alive = self.parser.should_keep_alive()
        exchange.wake()

    # ------------------------------------------------------------- the reader's side

    def fail(self, error: BaseException) -> None:
        """The exchange ends with `error` and the connection is not used again."""
        if self.exchange is not None:
            self.exchange.end(error)
        self.close()

    def consumed(self, exchange: _Exchange, size: int) -> None:
        exchange.buffered -= size
        if self.paused and exchange.buffered < LOW_WATER_BYTES and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    @property
    def usable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()


class UpstreamResponse:
    """A replica's answer whose headers have arrived; the body is read on demand. The
    connection goes back to the pool once the whole body is read (and the replica keeps
    it alive); `aclose` on an unfinished body closes the connection instead: a stream
    the client left must not be read to its end."""

    def __init__(self, upstream: "Upstream", connection: _Connection, exchange: _Exchange):
        self._upstream, self._connection, self._exchange = upstream, connection, exchange
        self._settled = False
        self.status_code = exchange.status

    def whole_body(self) -> Optional[bytes]:
        """The body, when all of it has already arrived (then the connection is settled
        as `aread` would); None while some is still to come."""
        exchange = self._exchange
        if not exchange.complete or exchange.error is not None:
            return None
        body = b"".join(exchange.chunks)
        exchange.chunks.clear()
        self._connection.consumed(exchange, len(body))
        self._settle()
        if len(body) > self._upstream.max_answer_bytes:
            raise AnswerTooLarge("answer", self._upstream.max_answer_bytes)
        return body

    async def aread(self) -> bytes:
        """The whole body; AnswerTooLarge as soon as more than the cap has arrived."""
        parts, size, limit = [], 0, self._upstream.max_answer_bytes
        async for data in self._chunks():
            size += len(data)
            if size > limit:
                raise self._refused("answer", limit)
            parts.append(data)
        return b"".join(parts)

    async def json(self) -> Any:
        """The body as JSON (ValueError when it is not)."""
        return json.loads(await self.aread())

    async def aiter_lines(self) -> AsyncIterator[str]:
        """The body's lines as they arrive, without their line ends (SSE's framing),
        up to the line cap (a tool call's arguments, many logprobs); AnswerTooLarge once
        more than the cap of one line is pending (a line that arrives whole in one read
        may pass it by at most that read)."""
        pending, limit = b"", self._upstream.max_line_bytes
        async for data in self._chunks():
            pending += data
            *lines, pending = pending.split(b"\n")
            if len(pending) > limit:
                raise self._refused("stream line", limit)
            for line in lines:
                yield line.rstrip(b"\r").decode()
        if pending:
            yield pending.rstrip(b"\r").decode()

    async def _chunks(self) -> AsyncIterator[bytes]:
        exchange, connection = self._exchange, self._connection
        while True:
            while exchange.chunks:
                data = exchange.chunks.popleft()
                connection.consumed(exchange, len(data))
                yield data
            if exchange.complete:
                break
            await self._upstream.wait(connection, exchange)
        self._settle()

    async def aclose(self) -> None:
        self._settle()

    def _refused(self, what: str, limit: int) -> AnswerTooLarge:
        """The answer is refused: its connection closed now, the rest never read."""
        self._settle()
        return AnswerTooLarge(what, limit)

    def _settle(self) -> None:
        """Once: the connection back to the pool when its answer was whole and kept alive,
        closed otherwise."""
        if self._settled:
            return
        self._settled = True
        exchange, connection = self._exchange, self._connection
        if exchange.complete and exchange.keep_alive and not exchange.chunks and connection.usable:
            self._upstream.put_back(connection)
        else:
            connection.close()


class Upstream:
    """Kept-alive connections per replica; `post` returns once the headers arrived."""

    def __init__(self, *, read_timeout_s: float, connect_timeout_s: float = 5.0,
                 max_connections: int = 1000, keepalive_s: float = GATEWAY_KEEPALIVE_S,
                 max_answer_bytes: int = MAX_ANSWER_BYTES, max_line_bytes: int = MAX_LINE_BYTES):
        self.max_answer_bytes = max_answer_bytes
        self.max_line_bytes = max_line_bytes
        self._read_timeout_s = read_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._keepalive_s = keepalive_s
        self._slots = asyncio.Semaphore(max_connections)   # connections open at once
        self._idle: dict[ReplicaAddress, deque[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._running = False

    async def __aenter__(self) -> "Upstream":
        self._running = True
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._running = False
        for connection in list(self._open):
            connection.close()
        self._open.clear()
        self._idle.clear()

    @property
    def connections(self) -> int:
        """Connections open now, idle or carrying an answer."""
        return len(self._open)

    async def post(self, url: str, body: Any, headers: Mapping[str, str]) -> UpstreamResponse:
        """The request, and its answer once the headers arrived."""
        return await (await self.request(url, body, headers)).answer()

    async def request(self, url: str, body: Any, headers: Mapping[str, str]) -> "PendingAnswer":
        """The request written to a connection; its answer is awaited apart, so that the
        caller can do its own work while the replica does the request's."""
        assert self._running, "Upstream used outside `async with`"
        key = address_of(url)
        parts = urlsplit(url)
        payload = json.dumps(body).encode()
        target = f"{parts.path or '/'}?{parts.query}" if parts.query else parts.path or "/"
        head = _request_head(target, "replica" if key.socket else parts.netloc, headers, len(payload))
        connection = await self._connection(key)
        exchange = connection.exchange = _Exchange()
        assert connection.transport is not None
        connection.transport.write(head + payload)
        return PendingAnswer(self, connection, exchange)

    async def wait(self, connection: _Connection, exchange: _Exchange) -> None:
        """Until the parser delivers more of the answer; UpstreamError when the answer
        broke off, was malformed or nothing arrived for the read timeout."""
        if exchange.error is None:
            loop = asyncio.get_running_loop()
            exchange.waiter = loop.create_future()
            timer = loop.call_later(self._read_timeout_s, connection.fail,
                                    asyncio.TimeoutError(f"no answer for {self._read_timeout_s} s"))
            try:
                await exchange.waiter
            except asyncio.CancelledError:
                connection.close()           # a half-read answer leaves the connection unusable
                raise
            finally:
                timer.cancel()
                exchange.waiter = None
        if exchange.error is not None:       # set by `fail` or a lost connection: closed
            raise UpstreamError(exchange.error)

    async def _connection(self, key: ReplicaAddress) -> _Connection:
        """An idle kept-alive connection to `key`, or a new one."""
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            connection = idle.pop()                       # the most recently used first
            if connection.usable and now - connection.idle_since < self._keepalive_s:
                return connection
            connection.close()
        await self._slots.acquire()
        try:
            _, protocol = await asyncio.wait_for(_connect(key, lambda: _Connection(key, self._lost)),
                                                 self._connect_timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:
            self._slots.release()
            raise UpstreamError(exc) from exc
        except BaseException:
            self._slots.release()
            raise
        self._open.add(protocol)
        return protocol

    def put_back(self, connection: _Connection) -> None:
        connection.exchange = None
        connection.idle_since = time.monotonic()
        self._idle.setdefault(connection.key, deque()).append(connection)

    def _lost(self, connection: _Connection) -> None:
        """A connection closed (by either side): its slot is free, and it is not idle."""
        if connection in self._open:
            self._open.discard(connection)
            self._slots.release()
        idle = self._idle.get(connection.key)
        if idle is not None and connection in idle:
            idle.remove(connection)


class PendingAnswer:
    """A request on its way: `answer()` waits for the replica's headers."""

    def __init__(self, upstream: Upstream, connection: _Connection, exchange: _Exchange):
        self._upstream, self._connection, self._exchange = upstream, connection, exchange

    async def answer(self) -> UpstreamResponse:
        while not self._exchange.headers_done:
            await self._upstream.wait(self._connection, self._exchange)
        return UpstreamResponse(self._upstream, self._connection, self._exchange)


def _connect(key: ReplicaAddress, factory: Callable[[], _Connection]) -> Awaitable[
        tuple[asyncio.BaseTransport, _Connection]]:
    loop = asyncio.get_running_loop()
    if key.socket is not None:
        return loop.create_unix_connection(factory, key.socket)
    return loop.create_connection(factory, key.host, key.port)


def _request_head(path: str, host: str, headers: Mapping[str, str], length: int) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"host: {host}", "content-type: application/json",
             f"content-length: {length}"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise ValueError(f"upstream: header {name!r} is not a single line")
        lines.append(f"{name}: {value}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("latin-1")
