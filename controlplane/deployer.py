"""Deploying and changing deployments: the one place that goes to S3, Postgres and the pool.

A new revision's model is read once, through `pool.inspect_model` (config.json
and the safetensors headers), checked (an architecture the engine runs, heads
that split over the replica's GPUs, a shape some inventory can hold), and
written with what was read. After every change the pool re-reads the desired
state, so a deploy, patch, traffic change or delete takes effect at once.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.deployment_spec import (DeploymentPatch, DeploymentSpec, RevisionConfig,
                                          check_model, patched_config)
from controlplane.models import Deployment, Revision
from controlplane.store import deployments
from controlplane.store.errors import InvalidField
from controlplane.traffic import parse_split, rollback_target
from pool.api import ModelInfo, ModelUnavailable, NeverFits, Pool, ReplicaShape

Deployed = tuple[Deployment, list[Revision]]


class Deployer:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], pool: Pool):
        self.sessions = sessions
        self.pool = pool

    async def create(self, tenant_id: str, spec: DeploymentSpec) -> Deployed:
        model = await self._check(spec.revision)
        async with self.sessions.begin() as session:
            created = await deployments.create(session, tenant_id, spec, model)
        await self.pool.refresh()
        return created

    async def patch(self, tenant_id: str, name: str, change: DeploymentPatch) -> Deployed:
        """Scaling changes in place; any other change makes a revision."""
        async with self.sessions() as session:
            _, revisions = await deployments.find_with_revisions(session, tenant_id, name)
        base = deployments.revision_config(revisions[-1])
        config = patched_config(base, change)
        new_revision = (config, await self._check(config)) if config != base else None
        async with self.sessions.begin() as session:
            changed = await deployments.change(session, tenant_id, name, change.scaling,
                                               new_revision, change.promote)
        await self.pool.refresh()
        return changed

    async def set_traffic(self, tenant_id: str, name: str, split: Any) -> Deployed:
        """`split` as the client sent it: {"r1": 90, "r2": 10}."""
        async with self.sessions.begin() as session:
            changed = await deployments.set_traffic(
                session, tenant_id, name, lambda _, names: parse_split(split, names))
        await self.pool.refresh()
        return changed

    async def rollback(self, tenant_id: str, name: str) -> Deployed:
        """All traffic to the revision before the newest one taking traffic."""
        async with self.sessions.begin() as session:
            changed = await deployments.set_traffic(
                session, tenant_id, name,
                lambda deployment, names: {rollback_target(deployment.traffic, names): 100})
        await self.pool.refresh()
        return changed

    async def delete(self, tenant_id: str, name: str) -> None:
        async with self.sessions.begin() as session:
            await deployments.delete(session, tenant_id, name)
        await self.pool.refresh()

    async def _check(self, config: RevisionConfig) -> ModelInfo:
        """The model a revision would run, read once from S3 and refused by field."""
        try:
            model = await self.pool.inspect_model(config.model_uri)
        except ModelUnavailable as exc:
            raise InvalidField("model_uri", str(exc)) from None
        check_model(model, config.resources)
        shape = ReplicaShape(config.resources.gpu_memory_gb, config.resources.gpu_count,
                             config.engine)
        try:
            self.pool.check_fits(model, shape)
        except NeverFits as exc:
            raise InvalidField("resources", str(exc)) from None
        return model
