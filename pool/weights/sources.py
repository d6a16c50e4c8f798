"""Which credentials read a model source: the platform's own, or those an admin granted
a tenant for its own bucket (DesiredStateSource.source_access, asked at every
inspection and cold start, so a revoked or rotated grant holds from the next one).

One WeightStore per set of credentials, all over the node's one cache; objects read
with a tenant's credentials are cached under keys of their own (S3Object.origin).
"""
from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Optional

from pool.api import DesiredStateSource, S3Access
from pool.s3 import open_client, with_access
from pool.weights.store import WeightStore


class SourceStores:
    def __init__(self, default: WeightStore, desired: DesiredStateSource, stack: AsyncExitStack):
        self.default = default
        self.desired = desired
        self.stack = stack
        self._stores: dict[S3Access, WeightStore] = {}

    async def access(self, tenant_id: Optional[str], uri: str) -> Optional[S3Access]:
        return None if tenant_id is None else await self.desired.source_access(tenant_id, uri)

    async def store_for(self, tenant_id: Optional[str], uri: str) -> WeightStore:
        access = await self.access(tenant_id, uri)
        if access is None:
            return self.default
        if access not in self._stores:
            settings = with_access(self.default.settings, access)
            client = await open_client(settings, self.stack)
            self._stores.setdefault(access, WeightStore(client, self.default.cache, settings,
                                                        origin=access.origin))
        return self._stores[access]
