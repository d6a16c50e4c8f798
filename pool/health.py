"""Asking a replica's runtime.serve.server how it is: /health, and whether its process lives;
what it serves (/v1/models) and what it has served (/stats).

/health answers 200 once the weights are loaded, 500 with `error` when the
load failed, 503 while loading (or in standby). It is the one path a replica
answers without its secret; the pool sends the handle's headers anyway, as on
every call it makes. The bodies, and the bounds on what the pool takes from
them, are wire/replica_control.py's. /v1/models answered with the secret and naming the
revision is how a replica left by an earlier pool proves it is the one its
record describes.
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional

import httpx

from pool.api import ColdStartFailed
from pool.backends.base import ReplicaHandle
from wire.replica_control import HEALTH_PATH, STATS_PATH, BadReply, Health, Stats


async def wait_healthy(handle: ReplicaHandle, http: httpx.AsyncClient, poll_s: float) -> Health:
    """Until /health says ready, then what it says; ColdStartFailed when the process exits
    or the load fails."""
    url = f"{handle.base_url}{HEALTH_PATH}"
    while True:
        if not handle.is_alive():
            raise ColdStartFailed(handle.exit_reason() or "runtime process exited while loading")
        try:
            resp = await http.get(url, timeout=2.0, headers=handle.headers)
            if resp.status_code == 200:
                return Health.parse(resp.json())
            if resp.status_code == 500:
                raise ColdStartFailed(f"runtime failed to load: {Health.parse(resp.json()).error}")
        except (httpx.HTTPError, ValueError):        # BadReply too: asked again
            pass
        await asyncio.sleep(poll_s)


async def why_unhealthy(handle: ReplicaHandle, http: httpx.AsyncClient) -> Optional[str]:
    """After a request failed on the replica: why it is dead or unhealthy, or None if it is fine."""
    reason = handle.exit_reason() if not handle.is_alive() else None
    if reason is not None:
        return reason
    try:
        resp = await http.get(f"{handle.base_url}{HEALTH_PATH}", timeout=2.0, headers=handle.headers)
    except httpx.HTTPError as exc:
        await wait_exit(handle, 1.0)          # a killed process may not be reaped yet
        return handle.exit_reason() or f"unreachable after a failed request: {type(exc).__name__}"
    if resp.status_code != 200:
        return f"unhealthy after a failed request: {resp.status_code} {resp.text[:200]}"
    return None


async def serves(handle: ReplicaHandle, http: httpx.AsyncClient, revision_id: str) -> bool:
    """True when the replica answers GET /v1/models with its secret and serves revision_id
    (ready: a replica still loading lists no model)."""
    body = await _get_json(handle, http, "/v1/models")
    data = body.get("data") if body else None
    return isinstance(data, list) and any(isinstance(m, dict) and m.get("id") == revision_id for m in data)


async def served_tokens(handle: ReplicaHandle, http: httpx.AsyncClient) -> Optional[tuple[int, int]]:
    """(prompt, completion) tokens the replica served since its process started, from its
    own counters (GET /stats); None when it does not answer in time, or with anything
    but two counters (`Stats.parse`)."""
    body = await _get_json(handle, http, STATS_PATH)
    if body is None:
        return None
    try:
        stats = Stats.parse(body)
    except BadReply:
        return None
    return stats.prompt_tokens, stats.completion_tokens


async def _get_json(handle: ReplicaHandle, http: httpx.AsyncClient, path: str) -> Optional[dict[str, Any]]:
    """The JSON object a 200 answer to GET path carries, or None."""
    try:
        resp = await http.get(f"{handle.base_url}{path}", timeout=2.0, headers=handle.headers)
        body = resp.json() if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None


async def wait_exit(handle: ReplicaHandle, timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while handle.is_alive() and loop.time() < deadline:
        await asyncio.sleep(0.02)
