"""The control plane's HTTP client for the hop to a replica: one aiohttp session, typed.

Every invocation crosses this hop, so its CPU per call caps how many calls per
second one control-plane process can pass. httpx's pool scans every pooled
connection on each request and each response close (an `is_socket_readable` poll
and a `getpeername` per connection): at 32 calls in flight to one replica that
was over half the control plane's CPU (py-spy, benchmarks/dynamic_batching.py).
aiohttp keeps idle connections per host in a queue and parses HTTP in C.

The gateway sees only `Upstream.post` and `UpstreamResponse` (status, the whole body,
or its lines as they arrive) and one error type, `UpstreamError`, for a replica that
cannot be reached or whose answer broke off.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Mapping, Optional

import aiohttp

from wire.keepalive import GATEWAY_KEEPALIVE_S


class UpstreamError(Exception):
    """The replica could not be reached, or its answer broke off or timed out."""

    def __init__(self, cause: BaseException):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.kind = type(cause).__name__


# what a broken hop raises: the connection refused or reset, a malformed or cut
# answer (ClientPayloadError), a read past the timeout
_FAILURES = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


class UpstreamResponse:
    """A replica's answer whose headers have arrived; the body is read on demand."""

    def __init__(self, response: aiohttp.ClientResponse):
        self._response = response
        self.status_code = response.status

    async def aread(self) -> bytes:
        try:
            return await self._response.read()
        except _FAILURES as exc:
            raise UpstreamError(exc) from exc

    async def json(self) -> Any:
        """The body as JSON (ValueError when it is not)."""
        return json.loads(await self.aread())

    async def aiter_lines(self) -> AsyncIterator[str]:
        """The body's lines as they arrive, without their line ends (SSE's framing).
        Split here rather than with StreamReader.readline, whose line-length cap would
        cut a long chunk (a tool call's arguments, many logprobs)."""
        pending = b""
        try:
            async for data in self._response.content.iter_any():
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.rstrip(b"\r").decode()
        except _FAILURES as exc:
            raise UpstreamError(exc) from exc
        if pending:
            yield pending.rstrip(b"\r").decode()

    async def aclose(self) -> None:
        # release() would drain an unfinished body to keep the connection; a stream the
        # client left must not be read to its end, so an unfinished one is closed
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()


class Upstream:
    """One connection pool for every replica; `post` returns once the headers arrived."""

    def __init__(self, *, read_timeout_s: float, connect_timeout_s: float = 5.0,
                 max_connections: int = 1000):
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s,
                                              sock_read=read_timeout_s)
        self._max_connections = max_connections
        self._session: Optional[aiohttp.ClientSession] = None

    async def __aenter__(self) -> "Upstream":
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0,
                                         keepalive_timeout=GATEWAY_KEEPALIVE_S),
            timeout=self._timeout, auto_decompress=False, trust_env=False)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def post(self, url: str, body: Any, headers: Mapping[str, str]) -> UpstreamResponse:
        assert self._session is not None, "Upstream used outside `async with`"
        try:
            response = await self._session.post(url, data=json.dumps(body).encode(), headers={
                **headers, "content-type": "application/json"})
        except _FAILURES as exc:
            raise UpstreamError(exc) from exc
        return UpstreamResponse(response)
