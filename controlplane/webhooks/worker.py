"""The delivery loop: claim due deliveries, POST them concurrently, record each attempt.

Run by a `controlplane.periodic.Periodic` in the lifespan of every control plane; they
share the work through the claim (controlplane.webhooks.deliveries). A round that finds
a full batch goes on at once; one that finds less waits for the next tick.
"""
from __future__ import annotations

import asyncio
import logging
import random
from datetime import datetime, timezone
from typing import Callable

from cryptography.exceptions import InvalidTag
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.sealing import Sealer
from controlplane.webhooks.backoff import RetryPolicy
from controlplane.webhooks.deliveries import Attempt, Claimed, after, claim, record
from controlplane.webhooks.sender import Sender

log = logging.getLogger("thawpool.webhooks")


class WebhookWorker:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], sealer: Sealer, sender: Sender,
                 policy: RetryPolicy, *, batch: int = 20,
                 jitter: Callable[[], float] = random.random):
        self.sessions = sessions
        self.sealer = sealer
        self.sender = sender
        self.policy = policy
        self.batch = batch
        self.jitter = jitter
        # past the sender's timeout, so a live worker records before anyone reclaims
        self.lease_s = sender.timeout_s * 2 + 30

    async def drain(self) -> int:
        """Rounds until one finds less than a batch due; the deliveries attempted."""
        done = 0
        while True:
            attempted = await self.round()
            done += attempted
            if attempted < self.batch:
                return done

    async def round(self) -> int:
        async with self.sessions.begin() as session:
            claimed = await claim(session, _now(), self.lease_s, self.batch)
        await asyncio.gather(*(self._deliver(c) for c in claimed))
        return len(claimed)

    async def _deliver(self, claimed: Claimed) -> None:
        attempt = await self._attempt(claimed)
        now = _now()
        then = after(attempt, claimed, self.policy, now, self.jitter())
        async with self.sessions.begin() as session:
            recorded = await record(session, claimed, attempt, then, now)
        if not recorded:
            log.warning("webhook delivery %s: claim lost before its attempt was recorded",
                        claimed.delivery_id)
        elif then.status == "failed":
            log.warning("webhook delivery %s to %s given up after %d attempts",
                        claimed.delivery_id, claimed.endpoint_id, claimed.attempt)

    async def _attempt(self, claimed: Claimed) -> Attempt:
        try:
            secret = self.sealer.open(claimed.secret_sealed, claimed.endpoint_id)
        except InvalidTag:       # another secrets key: it will not open on a retry either
            return Attempt(_now(), 0.0, None, "the endpoint's secret does not open with "
                                              "this control plane's secrets key")
        return await self.sender.send(claimed, secret)


def _now() -> datetime:
    return datetime.now(timezone.utc)
