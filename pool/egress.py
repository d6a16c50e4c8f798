"""The one way out of a sandbox: an HTTP proxy that opens only the hosts granted.

A build runs pip, and pip runs a requirement's build code: the tenant's code. Its
sandbox has no network (pool/sandbox.py). The installer inside
(runtime/functions/env.py) carries a loopback port of the sandbox to this proxy's
unix socket, bound into the sandbox, and points pip (and uv) at it; the proxy,
outside, in the platform's process, opens a connection only to the hosts the
operator's index names (`allowed_hosts`): CONNECT for https, absolute-form
requests for plain http. Anything else is a 403, and the build code has no other
route: not loopback, not the node's metadata address, not Ray's GCS. A function's
server has no way out at all unless the operator grants its tenant hosts (the
quota's `egress`); then runtime/functions/server.py carries a port to a proxy of
those hosts the same way.
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

from wire.socket_forward import ThreadServer, pipe

log = logging.getLogger(__name__)

PYPI = (("pypi.org", 443), ("files.pythonhosted.org", 443))
CONNECT_TIMEOUT_S = 30.0

Host = tuple[str, int]
HOST_NAME = re.compile(r"(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*")


def allowed_hosts(index_url: Optional[str]) -> frozenset[Host]:
    """The index's host and port (PyPI's two when the operator names none)."""
    if not index_url:
        return frozenset(PYPI)
    parts = urlsplit(index_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return frozenset({(parts.hostname or "", port)})


def parse_host(entry: str) -> Host:
    """`host:port` (a DNS name or an IPv4 address, a port 1-65535); ValueError otherwise."""
    host, _, port = entry.strip().lower().rpartition(":")
    if not HOST_NAME.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{entry!r} is not host:port")
    return host, int(port)


def target_of(head: bytes) -> tuple[str, Host, bytes]:
    """(method, (host, port), the head to send on) of a proxy request's head; ValueError
    when it is neither CONNECT host:port nor an absolute http:// URL."""
    line, _, rest = head.partition(b"\r\n")
    method, target, version = line.decode("latin-1").split(" ", 2)
    if method == "CONNECT":
        host, _, port = target.rpartition(":")
        return method, (host.strip("[]").lower(), int(port)), b""
    parts = urlsplit(target)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"not a proxy request: {target[:100]}")
    path = parts.path or "/"
    origin = f"{method} {path}{'?' + parts.query if parts.query else ''} {version}".encode("latin-1")
    return method, (parts.hostname.lower(), parts.port or 80), origin + b"\r\n" + rest


class EgressProxy(ThreadServer):
    """Listens on `socket`, which any uid may connect to: the allowlist is the guard."""

    def __init__(self, socket: Path, allowed: frozenset[Host]):
        super().__init__()
        self.socket, self.allowed = socket, allowed
        self.refused: list[Host] = []          # what was asked for and not opened

    def start(self) -> None:
        self.run(lambda: asyncio.start_unix_server(self._serve, str(self.socket)))
        os.chmod(self.socket, 0o666)

    def close(self) -> None:
        super().close()
        self.socket.unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            method, host, forward = target_of(head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, UnicodeError):
            await _answer(writer, b"400 Bad Request")
            return
        if host not in self.allowed:
            self.refused.append(host)
            log.info("egress refused: %s:%d", *host)
            await _answer(writer, b"403 Forbidden")
            return
        try:
            up_in, up_out = await asyncio.wait_for(asyncio.open_connection(*host), CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            await _answer(writer, b"502 Bad Gateway")
            return
        if method == "CONNECT":
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            up_out.write(forward)
        await asyncio.gather(pipe(reader, up_out), pipe(up_in, writer))


async def _answer(writer: asyncio.StreamWriter, status: bytes) -> None:
    writer.write(b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
    try:
        await writer.drain()
    except ConnectionError:
        pass
    writer.close()

