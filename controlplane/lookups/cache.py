"""The in-memory copy of what every request reads: API keys, deployments with their
revisions and traffic (and the shared ones by name), adapters, quota overrides and the
price book. Plain data and lookups, no database and no clock
(controlplane.lookups.service keeps it current and asks Postgres on a miss).

`generation` counts the changes applied: a miss read from Postgres is put in only if no
change was applied while it was read, so a slow read never brings back what a newer
change (a revoked key) took out.

A key hash Postgres does not know is remembered as unknown until a time the caller gives
(`mark_unknown`), so a flood of one made-up key costs one read per expiry; putting the key
(it was created since) forgets that at once, and at most MAX_UNKNOWN_KEYS are held.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Optional

from controlplane.store.tables import Adapter, Price
from controlplane.billing.pricing import INTERACTIVE, PriceRow, Pricing, price_at
from controlplane.quotas import Quota
from controlplane.store.prices import applicable
from controlplane.store.snapshot import Deployed, KeyEntry, Overrides, CacheSnapshot

MAX_UNKNOWN_KEYS = 10_000


@dataclass
class Cache:
    keys: dict[str, KeyEntry] = field(default_factory=dict)                 # by key hash
    deployments: dict[tuple[str, str], Deployed] = field(default_factory=dict)  # (tenant, name)
    shared: dict[str, Deployed] = field(default_factory=dict)               # catalogue bases by name
    adapters: dict[tuple[str, str], Adapter] = field(default_factory=dict)  # (tenant, name)
    quotas: dict[str, Overrides] = field(default_factory=dict)
    prices: dict[Optional[str], list[Price]] = field(default_factory=dict)  # plans (None: default)
    # deployment and adapter rows by their base deployment, whoever owns them: a shared
    # base's override prices every caller, a plan only its own tenant
    overrides: dict[str, list[Price]] = field(default_factory=dict)
    generation: int = 0
    # key hash -> until when it is taken as unknown (monotonic seconds); in insertion
    # order, which is expiry order since every entry lives the same time
    unknown_keys: dict[str, float] = field(default_factory=dict)
    _key_hashes: dict[str, str] = field(default_factory=dict)              # key id -> hash
    _deployment_names: dict[str, tuple[str, str]] = field(default_factory=dict)   # id -> key
    _adapter_names: dict[str, tuple[str, str]] = field(default_factory=dict)      # id -> key
    # what every call would otherwise rebuild, dropped whenever what they derive from changes
    _quota_of: dict[str, Quota] = field(default_factory=dict)             # tenant -> quota
    # applicable rows by (tenant, deployment, adapter)
    _price_rows: dict[tuple[str, str, Optional[str], str], list[PriceRow]] = field(default_factory=dict)

    # ---------------------------------------------------------- reads

    def key(self, key_hash: str) -> Optional[KeyEntry]:
        return self.keys.get(key_hash)

    def is_unknown(self, key_hash: str, now: float) -> bool:
        until = self.unknown_keys.get(key_hash)
        return until is not None and now < until

    def deployment(self, tenant_id: str, name: str) -> Optional[Deployed]:
        return self.deployments.get((tenant_id, name))

    def deployment_by_id(self, deployment_id: str) -> Optional[Deployed]:
        where = self._deployment_names.get(deployment_id)
        return self.deployments.get(where) if where is not None else None

    def shared_deployment(self, name: str) -> Optional[Deployed]:
        return self.shared.get(name)

    def adapter(self, tenant_id: str, name: str) -> Optional[Adapter]:
        return self.adapters.get((tenant_id, name))

    def quota(self, tenant_id: str, default: Quota) -> Quota:
        """`default` (the same for every call) with the tenant's overrides."""
        quota = self._quota_of.get(tenant_id)
        if quota is None:
            quota = self._quota_of[tenant_id] = default.with_overrides(self.quotas.get(tenant_id, {}))
        return quota

    def pricing(self, tenant_id: str, deployment_id: str, at: datetime,
                adapter_id: Optional[str] = None) -> Pricing:
        """The price of a call by `tenant_id` of a deployment (with an adapter, or the base
        model: None) at `at`: the adapter's row, else the deployment's override, else the
        caller's plan, else the default, each the latest row in effect then; zero while the
        book has no row."""
        return self.tier_pricing(tenant_id, deployment_id, at, adapter_id, INTERACTIVE) or Pricing()

    def tier_pricing(self, tenant_id: str, deployment_id: str, at: datetime,
                     adapter_id: Optional[str], tier: str) -> Optional[Pricing]:
        """`pricing` from the rows of one tier; None while the book has none in effect."""
        where = (tenant_id, deployment_id, adapter_id, tier)
        rows = self._price_rows.get(where)
        if rows is None:
            rows = self._price_rows[where] = applicable(
                [*self.prices.get(None, []), *self.prices.get(tenant_id, []),
                 *self.overrides.get(deployment_id, [])], deployment_id, adapter_id, tier)
        row = price_at(rows, at)
        return row.pricing if row is not None else None

    # ---------------------------------------------------------- changes

    def replace(self, snapshot: CacheSnapshot) -> None:
        """Everything at once (synchronous: no request sees half of it)."""
        self.keys, self._key_hashes = {}, {}
        self.deployments, self._deployment_names, self.shared = {}, {}, {}
        self.adapters, self._adapter_names = {}, {}
        for entry in snapshot.keys:
            self.put_key(entry)
        for deployed in snapshot.deployments:
            self.put_deployment(deployed)
        for adapter in snapshot.adapters:
            self.put_adapter(adapter)
        self.quotas, self._quota_of = dict(snapshot.quotas), {}
        self.set_prices(snapshot.prices)

    def put_key(self, entry: KeyEntry) -> None:
        self.keys[entry.key_hash] = entry
        self.unknown_keys.pop(entry.key_hash, None)
        self._key_hashes[entry.key_id] = entry.key_hash
        self.generation += 1

    def mark_unknown(self, key_hash: str, now: float, until: float) -> None:
        """Postgres holds no key with this hash: take it as unknown until `until`."""
        while self.unknown_keys:            # the expired, then the oldest past the cap
            oldest = next(iter(self.unknown_keys))
            if self.unknown_keys[oldest] > now and len(self.unknown_keys) < MAX_UNKNOWN_KEYS:
                break
            del self.unknown_keys[oldest]
        self.unknown_keys.pop(key_hash, None)
        self.unknown_keys[key_hash] = until

    def drop_key(self, key_id: str) -> None:
        key_hash = self._key_hashes.pop(key_id, None)
        if key_hash is not None:
            self.keys.pop(key_hash, None)
        self.generation += 1

    def put_deployment(self, deployed: Deployed) -> None:
        deployment = deployed[0]
        self.drop_deployment(deployment.id)
        where = (deployment.tenant_id, deployment.name)
        self.deployments[where] = deployed
        self._deployment_names[deployment.id] = where
        if deployment.shared:
            self.shared[deployment.name] = deployed

    def drop_deployment(self, deployment_id: str) -> None:
        """Gone (deleted): its name may already belong to a newer deployment, kept."""
        where = self._deployment_names.pop(deployment_id, None)
        held = self.deployments.get(where) if where is not None else None
        if where is not None and held is not None and held[0].id == deployment_id:
            del self.deployments[where]
            if self.shared.get(held[0].name) is held:
                del self.shared[held[0].name]
        self.generation += 1

    def put_adapter(self, adapter: Adapter) -> None:
        self.drop_adapter(adapter.id)
        where = (adapter.tenant_id, adapter.name)
        self.adapters[where] = adapter
        self._adapter_names[adapter.id] = where

    def drop_adapter(self, adapter_id: str) -> None:
        """Gone (deleted): its name may already belong to a newer adapter, kept."""
        where = self._adapter_names.pop(adapter_id, None)
        if where is not None and where in self.adapters and self.adapters[where].id == adapter_id:
            del self.adapters[where]
        self.generation += 1

    def set_quota(self, tenant_id: str, overrides: Optional[Overrides]) -> None:
        if overrides is None:
            self.quotas.pop(tenant_id, None)
        else:
            self.quotas[tenant_id] = overrides
        self._quota_of.pop(tenant_id, None)
        self.generation += 1

    def set_prices(self, rows: list[Price]) -> None:
        plans: dict[Optional[str], list[Price]] = {}
        overrides: dict[str, list[Price]] = {}
        for row in rows:
            if row.deployment_id is None:
                plans.setdefault(row.tenant_id, []).append(row)
            else:
                overrides.setdefault(row.deployment_id, []).append(row)
        self.prices, self.overrides, self._price_rows = plans, overrides, {}
        self.generation += 1
