"""What every request reads, from memory: the API key behind a bearer secret, the
caller's deployment with its revisions and traffic (or the adapter its `model` names,
with its base: controlplane.lookups.model_names), the price in effect, the
tenant's quota (controlplane.lookups.cache) and whether it has spend budgets. No database round trip on the hot path.

Kept current three ways: a change this control plane makes is applied before the call
that made it returns (`changed`); a change made anywhere (another control plane, SQL by
hand) reaches every control plane through Postgres NOTIFY (migration 0004's triggers)
within a second; and everything is read again every `refresh_s` and after the listener
reconnects, in case a notice was lost. One task applies changes in order, so a full
reload never undoes a newer change.

What memory does not hold (a key or deployment made since the last notice) is read from
Postgres and kept. A bearer secret not shaped like the keys we mint is refused without a
read; one shaped like them that Postgres does not hold is remembered as unknown for
`unknown_key_ttl_s` (or until the key is created), and requests that miss on the same
key at once share one read, so a flood of made-up keys costs one read per key per TTL.
While Postgres is out, all that memory holds keeps working, and a request that needs more
gets DatabaseUnavailable (503 with Retry-After), never a 500.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Awaitable, Callable, Optional, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.lookups.cache import Cache
from controlplane.auth.keys import hash_key, is_key_shaped
from controlplane.lookups.listener import Listener
from controlplane.lookups.model_names import ModelName, Resolved
from controlplane.store.tables import Adapter, utcnow
from controlplane.billing.pricing import BATCH, Pricing
from controlplane.quotas import Quota
from controlplane.store import adapters, budgets, deployments, snapshot
from controlplane.store.errors import DatabaseUnavailable, NotFound
from controlplane.store.failures import is_outage
from controlplane.store.snapshot import Deployed, KeyEntry
from controlplane.store.tenants import Principal

log = logging.getLogger("thawpool.lookups")
CHANNEL = "thawpool_cache"          # migration 0004 notifies '<table>:<id>' on it
T = TypeVar("T")


@dataclass(frozen=True)
class Change:
    """A changed row: api_keys:<key id>, deployments:<id> (revisions notify their
    deployment), adapters:<id>, tenant_quotas:<tenant id>, prices:<id>; or FULL, everything."""
    table: str
    row_id: str = ""

    @classmethod
    def parse(cls, payload: str) -> "Change":
        table, _, row_id = payload.partition(":")
        return cls(table, row_id)


FULL = Change("*")
Waiter = Optional["asyncio.Future[None]"]


class Lookups:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], default_quota: Quota, *,
                 refresh_s: float = 30.0, listen_dsn: Optional[str] = None,
                 timeout_s: float = 5.0, unknown_key_ttl_s: float = 5.0):
        self.sessions = sessions
        self.default_quota = default_quota
        self.refresh_s = refresh_s
        self.unknown_key_ttl_s = unknown_key_ttl_s
        self.cache = Cache()
        self.listener = Listener(listen_dsn, CHANNEL, self.heard, lambda: self._enqueue(FULL),
                                 timeout_s=timeout_s) if listen_dsn else None
        self._queue: asyncio.Queue[tuple[Change, Waiter]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._key_reads: dict[str, asyncio.Task[Optional[KeyEntry]]] = {}   # by key hash
        self._budgeted: set[str] = set()        # tenants with a spend budget

    async def start(self) -> None:
        """Everything read once (Postgres must answer now), then kept current."""
        await self._apply(FULL)
        self._tasks = [asyncio.create_task(self._work(), name="lookups-changes"),
                       asyncio.create_task(self._tick(), name="lookups-refresh")]
        if self.listener is not None:
            self.listener.start()

    async def stop(self) -> None:
        if self.listener is not None:
            await self.listener.stop()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ---------------------------------------------------------- the hot path

    async def principal(self, secret: str) -> Optional[Principal]:
        """The live key behind a bearer secret, or None (unknown, revoked or expired)."""
        if not is_key_shaped(secret):
            return None
        key_hash = hash_key(secret)
        entry = self.cache.key(key_hash)
        if entry is None and not self.cache.is_unknown(key_hash, time.monotonic()):
            entry = await self._shared_key_read(key_hash)
        return entry.principal_at(utcnow()) if entry is not None else None

    async def _shared_key_read(self, key_hash: str) -> Optional[KeyEntry]:
        """One read per key hash at a time; a waiter that leaves does not cancel it."""
        task = self._key_reads.get(key_hash)
        if task is None:
            task = asyncio.create_task(self._read_key(key_hash), name="lookups-key")
            self._key_reads[key_hash] = task
            task.add_done_callback(lambda _: self._key_reads.pop(key_hash, None))
        return await asyncio.shield(task)

    async def _read_key(self, key_hash: str) -> Optional[KeyEntry]:
        entry, keep = await self._read(lambda session: snapshot.load_key(session, key_hash=key_hash))
        if keep and entry is not None:
            self.cache.put_key(entry)
        elif keep:
            now = time.monotonic()
            self.cache.mark_unknown(key_hash, now, now + self.unknown_key_ttl_s)
        return entry

    async def deployment(self, tenant_id: str, name: str) -> Deployed:
        """The tenant's live deployment and its revisions; NotFound for any other name."""
        cached = self.cache.deployment(tenant_id, name)
        if cached is not None:
            return cached
        found, keep = await self._read(            # NotFound for any other name
            lambda session: deployments.find_with_revisions(session, tenant_id, name))
        if keep:
            self.cache.put_deployment(found)
        return found

    async def model(self, tenant_id: str, name: str) -> Resolved:
        """What a call's `model` names for this tenant (controlplane.lookups.model_names);
        NotFound for anything it may not use."""
        wanted = ModelName.parse(name)
        if wanted.adapter is not None:
            deployed = await self._visible_deployment(tenant_id, wanted.base)
            adapter = await self._adapter(tenant_id, wanted.adapter)
            if deployed is None or adapter is None:
                raise NotFound("adapter" if deployed is not None else "deployment",
                               wanted.adapter if deployed is not None else wanted.base)
            resolved = Resolved(*deployed, adapter)
        else:
            resolved = await self._bare_name(tenant_id, name)
        if not resolved.visible_to(tenant_id):
            raise NotFound("adapter" if resolved.adapter is not None else "deployment", name)
        return resolved

    async def _bare_name(self, tenant_id: str, name: str) -> Resolved:
        """The tenant's deployment, else its adapter, else a shared deployment."""
        try:
            return Resolved(*await self.deployment(tenant_id, name))
        except NotFound:
            pass
        adapter = await self._adapter(tenant_id, name)
        if adapter is not None:
            base = self.cache.deployment_by_id(adapter.deployment_id) or await self._read_base(adapter)
            if base is not None:
                return Resolved(*base, adapter)
        shared = await self._shared(name)
        if shared is None:
            raise NotFound("deployment", name)
        return Resolved(*shared)

    async def _visible_deployment(self, tenant_id: str, name: str) -> Optional[Deployed]:
        try:
            return await self.deployment(tenant_id, name)
        except NotFound:
            return await self._shared(name)

    async def _adapter(self, tenant_id: str, name: str) -> Optional[Adapter]:
        cached = self.cache.adapter(tenant_id, name)
        if cached is not None:
            return cached
        found, keep = await self._read(lambda session: _adapter_named(session, tenant_id, name))
        if keep and found is not None:
            self.cache.put_adapter(found)
        return found

    async def _shared(self, name: str) -> Optional[Deployed]:
        cached = self.cache.shared_deployment(name)
        if cached is not None:
            return cached
        return await self._kept(lambda session: snapshot.find_shared(session, name))

    async def _read_base(self, adapter: Adapter) -> Optional[Deployed]:
        return await self._kept(lambda session: snapshot.load_deployment(session, adapter.deployment_id))

    async def _kept(self, read: Callable[[AsyncSession], Awaitable[Optional[Deployed]]]) -> Optional[Deployed]:
        """A deployment read from Postgres, kept in memory when found."""
        found, keep = await self._read(read)
        if keep and found is not None:
            self.cache.put_deployment(found)
        return found

    def pricing(self, tenant_id: str, deployment_id: str, at: datetime,
                adapter_id: Optional[str] = None) -> Pricing:
        return self.cache.pricing(tenant_id, deployment_id, at, adapter_id)

    def batch_pricing(self, tenant_id: str, deployment_id: str, at: datetime,
                      adapter_id: Optional[str] = None) -> Optional[Pricing]:
        """The price book's batch rows for such a call; None where it has none."""
        return self.cache.tier_pricing(tenant_id, deployment_id, at, adapter_id, BATCH)

    def quota(self, tenant_id: str) -> Quota:
        return self.cache.quota(tenant_id, self.default_quota)

    def has_budgets(self, tenant_id: str) -> bool:
        """Whether the tenant has a budget (on itself, a key or a deployment): a budget
        set on another control plane counts here within a second (migration 0019's
        notice), on this one before the call that set it returns."""
        return tenant_id in self._budgeted

    # ---------------------------------------------------------- changes

    async def changed(self, *changes: Change) -> None:
        """After this process committed a write: applied before this returns."""
        waiters = [asyncio.get_running_loop().create_future() for _ in changes]
        for change, waiter in zip(changes, waiters):
            self._enqueue(change, waiter)
        await asyncio.gather(*waiters)

    def heard(self, payload: str) -> None:
        """A NOTIFY from Postgres."""
        self._enqueue(Change.parse(payload))

    def _enqueue(self, change: Change, waiter: Waiter = None) -> None:
        self._queue.put_nowait((change, waiter))

    async def _work(self) -> None:
        """Changes in order; queued ones are taken together (a FULL among them covers the
        rest: each was committed before the full read began)."""
        while True:
            items = [await self._queue.get()]
            while not self._queue.empty():
                items.append(self._queue.get_nowait())
            changes = [c for c, _ in items]
            for change in [FULL] if FULL in changes else list(dict.fromkeys(changes)):
                await self._apply_logged(change)
            for _, waiter in items:
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            self._enqueue(FULL)

    async def _apply_logged(self, change: Change) -> None:
        try:
            await self._apply(change)
        except Exception as exc:  # noqa: BLE001 - memory stays as it was; a later read fixes it
            log.warning("cache not updated", extra={"change": f"{change.table}:{change.row_id}",
                                                    "error": repr(exc)[:300]})

    async def _apply(self, change: Change) -> None:
        reload = {"*": self._reload_all, "api_keys": self._reload_key,
                  "deployments": self._reload_deployment, "revisions": self._reload_deployment,
                  "adapters": self._reload_adapter,
                  "tenant_quotas": self._reload_quota, "prices": self._reload_prices,
                  "budgets": self._reload_budgets,
                  }.get(change.table)
        if reload is not None:
            async with self.sessions() as session:
                await reload(session, change.row_id)

    async def _reload_all(self, session: AsyncSession, _: str) -> None:
        self.cache.replace(await snapshot.load_all(session))
        self._budgeted = await budgets.budgeted_tenants(session)

    async def _reload_budgets(self, session: AsyncSession, tenant_id: str) -> None:
        if await budgets.has_budgets(session, tenant_id):
            self._budgeted.add(tenant_id)
        else:
            self._budgeted.discard(tenant_id)

    async def _reload_key(self, session: AsyncSession, key_id: str) -> None:
        entry = await snapshot.load_key(session, key_id=key_id)
        if entry is None:
            self.cache.drop_key(key_id)
        else:
            self.cache.put_key(entry)

    async def _reload_deployment(self, session: AsyncSession, deployment_id: str) -> None:
        deployed = await snapshot.load_deployment(session, deployment_id)
        if deployed is None:
            self.cache.drop_deployment(deployment_id)
        else:
            self.cache.put_deployment(deployed)

    async def _reload_adapter(self, session: AsyncSession, adapter_id: str) -> None:
        adapter = await snapshot.load_adapter(session, adapter_id)
        if adapter is None:
            self.cache.drop_adapter(adapter_id)
        else:
            self.cache.put_adapter(adapter)

    async def _reload_quota(self, session: AsyncSession, tenant_id: str) -> None:
        overrides = await snapshot.load_quotas(session, tenant_id)
        self.cache.set_quota(tenant_id, overrides.get(tenant_id))

    async def _reload_prices(self, session: AsyncSession, _: str) -> None:
        self.cache.set_prices(await snapshot.load_prices(session))

    async def _read(self, read: Callable[[AsyncSession], Awaitable[T]]) -> tuple[T, bool]:
        """What memory does not hold, from Postgres, and whether memory may keep it (no
        change was applied while it was read)."""
        generation = self.cache.generation
        try:
            async with self.sessions() as session:
                found = await read(session)
        except Exception as exc:
            if is_outage(exc):
                raise DatabaseUnavailable("the database did not answer; retry shortly") from exc
            raise
        return found, self.cache.generation == generation


async def _adapter_named(session: AsyncSession, tenant_id: str, name: str) -> Optional[Adapter]:
    try:
        return (await adapters.find(session, tenant_id, name))[0]
    except NotFound:
        return None
