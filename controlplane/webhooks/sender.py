"""One signed POST of a delivery, bounded in time: a slow or silent receiver costs one
worker slot for at most `timeout_s`, never the control plane's requests.

The answer's body is never read (only its status counts), and redirects are not
followed (a 3xx is a failed attempt), so a receiver cannot send the worker elsewhere.
"""
from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from types import TracebackType
from typing import Optional
from urllib.parse import urlsplit

import httpx

from controlplane.webhooks.deliveries import Attempt, Claimed
from controlplane.webhooks.signing import (EVENT_ID_HEADER, EVENT_TYPE_HEADER, SIGNATURE_HEADER,
                                           sign)
from controlplane.webhooks.targets import refusal, resolve

USER_AGENT = "thawpool-webhooks/1"


class Sender:
    def __init__(self, timeout_s: float, allow_private_targets: bool):
        self.timeout_s = timeout_s
        self.allow_private_targets = allow_private_targets
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), follow_redirects=False,
                                      trust_env=False)

    async def __aenter__(self) -> "Sender":
        return self

    async def __aexit__(self, kind: Optional[type[BaseException]], exc: Optional[BaseException],
                        tb: Optional[TracebackType]) -> None:
        await self.http.aclose()

    async def send(self, claimed: Claimed, secret: str) -> Attempt:
        started, clock = datetime.now(timezone.utc), time.monotonic()
        status, error = None, None
        try:
            async with asyncio.timeout(self.timeout_s):
                blocked = await self._blocked(claimed)
                if blocked is not None:
                    error = blocked
                else:
                    status = await self._post(claimed, secret)
        except Exception as exc:  # noqa: BLE001 - whatever failed is this attempt's outcome
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return Attempt(started, (time.monotonic() - clock) * 1000, status, error)

    async def _blocked(self, claimed: Claimed) -> Optional[str]:
        if claimed.operator or self.allow_private_targets:
            return None
        parts = urlsplit(claimed.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return refusal(await resolve(parts.hostname or "", port))

    async def _post(self, claimed: Claimed, secret: str) -> int:
        headers = {"content-type": "application/json", "user-agent": USER_AGENT,
                   SIGNATURE_HEADER: sign(secret, int(time.time()), claimed.body),
                   EVENT_ID_HEADER: claimed.event_id, EVENT_TYPE_HEADER: claimed.event_type}
        async with self.http.stream("POST", claimed.url, content=claimed.body,
                                    headers=headers) as response:
            return response.status_code
