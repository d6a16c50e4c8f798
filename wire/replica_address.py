"""Where a replica listens: a TCP host and port, or a unix socket.

A sandboxed replica has no network of its own (docs/security.md): it listens on
a unix socket in a folder the pool gave it, and its base URL names that socket
as `http+unix://<hex of the socket's path>`. Hex, because URL hosts are
case-folded and a path is not; the control plane's client to replicas
(controlplane/gateway/upstream.py) and the pool's (pool/replica_http.py) both read a
base URL with `address_of`, so the two agree on one spelling.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional
from urllib.parse import urlsplit

UNIX_SCHEME = "http+unix"


@dataclass(frozen=True)
class ReplicaAddress:
    host: str
    port: int
    socket: Optional[str] = None     # a unix socket's path: host and port then say nothing


def unix_base_url(socket_path: str) -> str:
    return f"{UNIX_SCHEME}://{socket_path.encode().hex()}"


def address_of(url: str) -> ReplicaAddress:
    """The address a base URL (or a URL under it) names; ValueError for anything but
    http:// and http+unix://."""
    parts = urlsplit(url)
    if parts.scheme == UNIX_SCHEME and parts.hostname:
        try:
            return ReplicaAddress("", 0, bytes.fromhex(parts.hostname).decode())
        except ValueError:
            raise ValueError(f"not a replica's unix socket URL: {url!r}") from None
    if parts.scheme != "http" or parts.hostname is None:
        raise ValueError(f"only http:// and {UNIX_SCHEME}:// replica URLs are served, not {url!r}")
    return ReplicaAddress(parts.hostname, parts.port or 80)
