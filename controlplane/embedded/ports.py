"""Free TCP ports on loopback."""
from __future__ import annotations

import socket
import time

# One free-port helper for the repo; controlplane may depend on pool, not the reverse.
from pool.processes import free_port  # noqa: F401  (re-exported)


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Distinct free ports, all held open together so none repeats."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def wait_for_port(host: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False
