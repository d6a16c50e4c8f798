"""Attaching a tenant's LoRA adapter to a base deployment, and detaching it: the one place
adapters go to S3, Postgres and the pool.

An attach runs in one transaction under the tenant's lock (as a deploy does), checking
before it stores anything, in order: the name (409 when one of the tenant's deployments
or adapters has it), the base (404 unless the tenant's own live deployment or a shared
one of that name; 422 naming `base` unless each revision taking traffic can take
adapters), the adapter's URI (403 outside the tenant's model sources, by the rules its
deployments' model_uri is held to, before any S3 request), then the reads: the adapter's
two files through the pool with the tenant's access, and each serving revision's model
with its owner's, for the sizes the adapter's tensors must have; a refusal of the adapter
is spec.lora_adapter's, naming its field. After the commit the gateway's in-memory copy
hears of the change (controlplane.lookups).
"""
from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.deploy.adapter_spec import (AdapterSpec, ServingRevision, base_dims, check_adapter,
                                              check_base, refusal_of)
from controlplane.deploy.deployer import read_or_refuse
from controlplane.deploy.model_sources import check_source
from controlplane.lookups.service import Change, Lookups
from controlplane.store import adapters, deployments, model_sources, names, quotas
from controlplane.store.adapters import Attached
from controlplane.store.errors import InvalidField, NotFound
from controlplane.store.tables import Adapter, Deployment, Tenant
from pool.api import AdapterInfo, Pool
from spec.lora_adapter import AdapterSettings, BaseDims


class Attacher:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], pool: Pool, *,
                 models_bucket: str, lookups: Lookups):
        self.sessions = sessions
        self.pool = pool
        self.models_bucket = models_bucket
        self.lookups = lookups

    async def attach(self, tenant_id: str, spec: AdapterSpec) -> Attached:
        async with self.sessions.begin() as session:
            tenant = await quotas.lock_tenant(session, tenant_id)
            await names.check_free(session, tenant_id, spec.name, "adapter")
            base = await adapters.find_base(session, tenant_id, spec.base)
            if base is None:
                raise NotFound("deployment", spec.base)
            serving = check_base(spec.base, base, await deployments.revisions_of(session, base))
            await self._check_source(session, tenant, spec.adapter_uri)
            info = await read_or_refuse(self.pool.inspect_adapter(spec.adapter_uri, tenant_id), refusal_of)
            settings = check_adapter(info, min(s.max_lora_rank for s in serving),
                                     await self._dims(spec.base, base, serving, tenant_id))
            adapter = await adapters.create(session, _row(tenant_id, spec, base, info, settings))
        await self.lookups.changed(Change("adapters", adapter.id))
        return adapter, base

    async def detach(self, tenant_id: str, name: str) -> Attached:
        async with self.sessions.begin() as session:
            adapter, base = await adapters.delete(session, tenant_id, name)
        await self.lookups.changed(Change("adapters", adapter.id))
        return adapter, base

    async def _check_source(self, session: AsyncSession, tenant: Tenant, adapter_uri: str) -> None:
        """The rule of a deployment's model_uri: under one of the tenant's sources (403)."""
        sources = await model_sources.sources_for(session, tenant, self.models_bucket)
        check_source("adapter_uri", adapter_uri, [s.prefix for s in sources])

    async def _dims(self, name: str, base: Deployment, serving: list[ServingRevision],
                    tenant_id: str) -> list[BaseDims]:
        """The sizes of each model the base serves now, read with its owner's access. A
        shared base's model is not the caller's to see: a failed read names no URI."""
        uris = sorted({s.revision.model_uri for s in serving})
        own = base.tenant_id == tenant_id

        def refusal(why: str) -> InvalidField:
            return InvalidField("base", f"its model could not be read{': ' + why if own else ''}")
        return [base_dims(await read_or_refuse(self.pool.inspect_model(uri, base.tenant_id), refusal))
                for uri in uris]


def _row(tenant_id: str, spec: AdapterSpec, base: Deployment, info: AdapterInfo,
         settings: AdapterSettings) -> Adapter:
    return Adapter(tenant_id=tenant_id, name=spec.name, deployment_id=base.id,
                   adapter_uri=spec.adapter_uri, rank=settings.rank,
                   target_modules=list(settings.target_modules), weight_bytes=info.weight_bytes,
                   pinned_objects=adapters.pinned(info.objects))
