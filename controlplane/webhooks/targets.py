"""Which addresses a webhook may be POSTed to.

A tenant names the URL, so the control plane's own network is off limits to it:
loopback, private, link-local (cloud metadata), multicast and reserved addresses are
refused for a tenant's endpoint unless the operator allows private targets
(`settings.webhook_allow_private_targets`, for one-machine setups and tests). The
operator's own endpoints may reach anything. The host is resolved just before the POST
and every address it resolves to must pass; a DNS answer that changes between this
check and the connection is not covered (put an egress proxy in front for that).
"""
from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Optional


def refusal(addresses: list[str]) -> Optional[str]:
    """Why these addresses may not be reached by a tenant's webhook; None: they may."""
    if not addresses:
        return "the host resolved to no address"
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%")[0])
        if not ip.is_global or ip.is_multicast:
            return f"blocked address {ip} (not a public address)"
    return None


async def resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})
