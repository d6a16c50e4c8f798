"""The pool's HTTP client to replicas: TCP or a sandboxed replica's unix socket.

One `httpx.AsyncClient` serves every replica, so the socket is chosen per
request from the URL (wire/replica_address.py), not per client: a
`http+unix://` URL goes through a transport bound to its socket, anything else
through the plain one.
"""
from __future__ import annotations

import httpx

from wire.replica_address import UNIX_SCHEME, address_of


class ReplicaTransport(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self._tcp = httpx.AsyncHTTPTransport()
        self._sockets: dict[str, httpx.AsyncHTTPTransport] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
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
