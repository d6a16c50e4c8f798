"""Asking a replica's runtime.server how it is: /health, and whether its process lives.

/health answers 200 once the weights are loaded, 500 with `error` when the
load failed, 503 while loading (or in standby).
"""
from __future__ import annotations

import asyncio
from typing import Optional

import httpx

from pool.api import ColdStartFailed
from pool.backends.base import ReplicaHandle


async def wait_healthy(handle: ReplicaHandle, http: httpx.AsyncClient, poll_s: float) -> None:
    """Until /health says ready; ColdStartFailed when the process exits or the load fails."""
    url = f"{handle.base_url}/health"
    while True:
        if not handle.is_alive():
            raise ColdStartFailed(handle.exit_reason() or "runtime process exited while loading")
        try:
            resp = await http.get(url, timeout=2.0)
            if resp.status_code == 200:
                return
            if resp.status_code == 500:
                raise ColdStartFailed(f"runtime failed to load: {resp.json().get('error')}")
        except (httpx.HTTPError, ValueError):
            pass
        await asyncio.sleep(poll_s)


async def why_unhealthy(handle: ReplicaHandle, http: httpx.AsyncClient) -> Optional[str]:
    """After a request failed on the replica: why it is dead or unhealthy, or None if it is fine."""
    reason = handle.exit_reason() if not handle.is_alive() else None
    if reason is not None:
        return reason
    try:
        resp = await http.get(f"{handle.base_url}/health", timeout=2.0)
    except httpx.HTTPError as exc:
        await wait_exit(handle, 1.0)          # a killed process may not be reaped yet
        return handle.exit_reason() or f"unreachable after a failed request: {type(exc).__name__}"
    if resp.status_code != 200:
        return f"unhealthy after a failed request: {resp.status_code} {resp.text[:200]}"
    return None


async def wait_exit(handle: ReplicaHandle, timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while handle.is_alive() and loop.time() < deadline:
        await asyncio.sleep(0.02)
