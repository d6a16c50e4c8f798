"""The pool's HTTP client to replicas: TCP or a sandboxed replica's unix socket.

One `httpx.AsyncClient` serves every replica, so the socket is chosen per
request from the URL (wire/replica_address.py), not per client: a
`http+unix://` URL goes through a transport bound to its socket, anything else
through the plain one. What the pool asks a replica (health, stats, load, sleep,
wake) is answered in a few hundred bytes; an answer past MAX_ANSWER_BYTES is cut
off as a broken one (a replica's answers are read, never trusted, here too).
"""
from __future__ import annotations

from typing import AsyncIterator

import httpx

from wire.replica_address import UNIX_SCHEME, address_of

MAX_ANSWER_BYTES = 1 << 20


class ReplicaBodyTooLarge(httpx.RemoteProtocolError):
    pass


class _Capped(httpx.AsyncByteStream):
    def __init__(self, stream: httpx.AsyncByteStream, limit: int):
        self._stream, self._limit = stream, limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._stream:
            seen += len(chunk)
            if seen > self._limit:
                raise ReplicaBodyTooLarge(f"a replica's answer past {self._limit} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


class ReplicaTransport(httpx.AsyncBaseTransport):
    def __init__(self, max_answer_bytes: int = MAX_ANSWER_BYTES) -> None:
        self._tcp = httpx.AsyncHTTPTransport()
        self._sockets: dict[str, httpx.AsyncHTTPTransport] = {}
        self._limit = max_answer_bytes

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._route(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _Capped(response.stream, self._limit)
        return response

    async def _route(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != UNIX_SCHEME:
            return await self._tcp.handle_async_request(request)
        socket = address_of(str(request.url)).socket
        assert socket is not None
        transport = self._sockets.get(socket)
        if transport is None:
            transport = self._sockets[socket] = httpx.AsyncHTTPTransport(uds=socket)
        request.url = request.url.copy_with(scheme="http", host="replica")
        try:
            return await transport.handle_async_request(request)
        except httpx.ConnectError:
            # a replica that is gone leaves no transport behind
            self._sockets.pop(socket, None)
            await transport.aclose()
            raise

    async def aclose(self) -> None:
        transports, self._sockets = list(self._sockets.values()), {}
        for transport in [self._tcp, *transports]:
            await transport.aclose()


def replica_client(timeout: httpx.Timeout) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=timeout, transport=ReplicaTransport())
