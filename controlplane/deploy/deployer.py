"""Deploying and changing deployments: the one place that goes to S3, Postgres and the pool.

Every change runs in one transaction that first locks the tenant's row, then
the deployment's: what it reads (the revisions, the traffic, what the tenant
holds) and what it writes happen under the same locks, so two concurrent
changes cannot undo each other or pass a quota together. In order: the static
quota (422 naming the limit), the model sources (403, before any S3 request),
the model read once through `pool.inspect_model` and checked (an architecture
the engine runs, heads that split over the replica's GPUs, a shape some
inventory can hold), then the write. After every change the gateway's in-memory copy
(controlplane.lookups.service) and the pool's desired state are read again, so a deploy, patch,
traffic change or delete takes effect at once.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable, Optional, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.deploy.deployment_spec import (DRAFT_MODEL, DeploymentPatch, DeploymentSpec,
                                          Resources, RevisionConfig, check_model,
                                          parse_scaling, patched_config)
from controlplane.deploy.fallback_spec import Fallback, Serves, mismatch
from controlplane.deploy.function_spec import check_function
from controlplane.lookups.service import Change, Lookups
from controlplane.deploy.model_sources import check_source
from controlplane.store.tables import Deployment, Revision, Tenant
from controlplane.quotas import DeploymentShape, Quota, check_deployment
from controlplane.store import adapters, deployments, model_sources, quotas
from controlplane.store.errors import InvalidField, NotFound, Unavailable
from controlplane.deploy.traffic import parse_split, rollback_target
from pool.api import ModelInfo, ModelUnavailable, NeverFits, Pins, Pool, ReplicaShape
from spec.engine_options import ChosenOptions
from pool.s3 import is_transient

Deployed = tuple[Deployment, list[Revision]]
# (the deployment, its revision names) -> the new split; raises InvalidField
SplitRule = Callable[[Deployment, list[str]], dict[str, int]]
T = TypeVar("T")


class Deployer:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], pool: Pool, *,
                 models_bucket: str, default_quota: Quota, lookups: Lookups):
        self.sessions = sessions
        self.pool = pool
        self.models_bucket = models_bucket
        self.default_quota = default_quota
        self.lookups = lookups

    async def create(self, tenant_id: str, spec: DeploymentSpec) -> Deployed:
        async with self.sessions.begin() as session:
            tenant = await quotas.lock_tenant(session, tenant_id)
            shape = DeploymentShape(spec.scaling.min_replicas, spec.scaling.max_replicas,
                                    (spec.revision.resources.gpu_count,))
            await self._check_quota(session, tenant_id, shape, None, None)
            model, pins = await self._check(session, tenant, spec.revision)
            await _check_fallbacks(session, tenant_id, spec.name, _serves(spec.revision), spec.fallbacks)
            created = await deployments.create(session, tenant_id, spec, model, pins)
        await self._changed(created[0].id)
        return created

    async def patch(self, tenant_id: str, name: str, change: DeploymentPatch) -> Deployed:
        """Scaling changes in place; any other change makes a revision."""
        async with self.sessions.begin() as session:
            tenant, deployment, revisions = await self._locked(session, tenant_id, name)
            base = deployments.revision_config(revisions[-1])
            config = patched_config(base, change)
            before = deployments.scaling_of(deployment)
            scaling = parse_scaling(change.scaling, before) if change.scaling else before
            new = config != base
            gpus = ((config.resources.gpu_count,) if new and change.promote
                    else _traffic_gpus(deployment.traffic, revisions))
            await self._check_quota(
                session, tenant_id, DeploymentShape(scaling.min_replicas, scaling.max_replicas, gpus),
                deployment, revisions)
            new_revision = (config, *await self._check(session, tenant, config)) if new else None
            if change.fallbacks is not None:
                await _check_fallbacks(session, tenant_id, name, _serves(config), change.fallbacks)
            changed = await deployments.change(session, deployment, revisions, scaling,
                                               new_revision, change.promote, change.fallbacks)
        await self._changed(deployment.id)
        return changed

    async def set_traffic(self, tenant_id: str, name: str, split: Any) -> Deployed:
        """`split` as the client sent it: {"r1": 90, "r2": 10}."""
        return await self._retarget(tenant_id, name, lambda _, names: parse_split(split, names))

    async def rollback(self, tenant_id: str, name: str) -> Deployed:
        """All traffic to the revision before the newest one taking traffic."""
        return await self._retarget(
            tenant_id, name,
            lambda deployment, names: {rollback_target(deployment.traffic, names): 100})

    async def delete(self, tenant_id: str, name: str) -> None:
        """The deployment, and the adapters attached to it (any tenant's, on a shared base)."""
        async with self.sessions.begin() as session:
            deployment_id = await deployments.delete(session, tenant_id, name)
            detached = await adapters.delete_on(session, deployment_id)
        await self.lookups.changed(*(Change("adapters", a) for a in detached))
        await self._changed(deployment_id)

    async def set_shared(self, tenant_id: str, name: str, shared: bool) -> Deployed:
        """The operator's: the deployment in or out of the catalogue of shared bases."""
        async with self.sessions.begin() as session:
            _, deployment, revisions = await self._locked(session, tenant_id, name)
            await deployments.set_shared(session, deployment, shared)
        await self._changed(deployment.id)
        return deployment, revisions

    async def _changed(self, deployment_id: str) -> None:
        """After the commit: the gateway's memory, then the pool, see the change at once."""
        await self.lookups.changed(Change("deployments", deployment_id))
        await self.pool.refresh()

    async def _retarget(self, tenant_id: str, name: str, rule: SplitRule) -> Deployed:
        async with self.sessions.begin() as session:
            _, deployment, revisions = await self._locked(session, tenant_id, name)
            traffic = rule(deployment, [r.name for r in revisions])
            shape = DeploymentShape(deployment.min_replicas, deployment.max_replicas,
                                    _traffic_gpus(traffic, revisions))
            await self._check_quota(session, tenant_id, shape, deployment, revisions)
            await deployments.set_traffic(session, deployment, traffic)
        await self._changed(deployment.id)
        return deployment, revisions

    async def _locked(self, session: AsyncSession, tenant_id: str,
                      name: str) -> tuple[Tenant, Deployment, list[Revision]]:
        """The tenant's row, then the deployment's, locked; the revisions read under them."""
        tenant = await quotas.lock_tenant(session, tenant_id)
        deployment = await deployments.find(session, tenant_id, name, for_update=True)
        return tenant, deployment, await deployments.revisions_of(session, deployment)

    async def _check_quota(self, session: AsyncSession, tenant_id: str, shape: DeploymentShape,
                           deployment: Optional[Deployment],
                           revisions: Optional[list[Revision]]) -> None:
        """The static limits, for a new deployment (`deployment` None) or a change of one
        (refused only where it goes past a limit, or further past one)."""
        quota = await quotas.quota_for(session, tenant_id, self.default_quota)
        others = await quotas.holdings(session, tenant_id,
                                       excluding=deployment.id if deployment else None)
        before = None
        if deployment is not None and revisions is not None:
            before = DeploymentShape(deployment.min_replicas, deployment.max_replicas,
                                     _traffic_gpus(deployment.traffic, revisions))
        check_deployment(quota, shape, others, before=before)

    async def _check(self, session: AsyncSession, tenant: Tenant,
                     config: RevisionConfig) -> tuple[ModelInfo, Pins]:
        """The models a new revision would run: under the tenant's sources (checked before
        any S3 request), then read once from S3 and refused by field. With the model's
        info, the objects read (the model's and the draft's), which the revision pins."""
        sources = [s.prefix for s in
                   await model_sources.sources_for(session, tenant, self.models_bucket)]
        check_source("model_uri", config.model_uri, sources)
        draft = config.draft_model_uri
        if draft is not None:
            check_source(DRAFT_MODEL, draft, sources)
        model = await self._inspect("model_uri", config.model_uri, tenant.id)
        if config.kind == "function":
            check_function(model, config.resources)
        else:
            check_model(model, config.resources, engine=config.engine)
        pins = dict(model.objects)
        if draft is not None:
            draft_model = await self._inspect(DRAFT_MODEL, draft, tenant.id)
            check_model(draft_model, Resources(), DRAFT_MODEL)
            pins.update(draft_model.objects)
        shape = ReplicaShape(config.resources.gpu_memory_gb, config.resources.gpu_count,
                             ChosenOptions(config.engine))
        try:
            self.pool.check_fits(model, shape)
        except NeverFits as exc:
            raise InvalidField("resources", str(exc)) from None
        return model, pins

    async def _inspect(self, field_name: str, model_uri: str, tenant_id: str) -> ModelInfo:
        return await read_or_refuse(self.pool.inspect_model(model_uri, tenant_id),
                                    lambda why: InvalidField(field_name, why))


async def read_or_refuse(read: Awaitable[T], refusal: Callable[[str], Exception]) -> T:
    """What the pool reads from S3; what it could not read is `refusal(why)` (a 422 naming
    the field), and S3 down or failing after the pool's retries a 503 to retry, not a 500."""
    try:
        return await read
    except ModelUnavailable as exc:
        raise refusal(str(exc)) from None
    except Exception as exc:
        if is_transient(exc):
            raise Unavailable(f"object storage did not answer ({type(exc).__name__})") from exc
        raise


async def _check_fallbacks(session: AsyncSession, tenant_id: str, name: str, primary: Serves,
                           fallbacks: tuple[Fallback, ...]) -> None:
    """Each fallback another live deployment of the same tenant (another tenant's name is
    not found, as everywhere), answering what `name` answers; InvalidField (422) naming
    the entry. Their own fallbacks are never followed (fallback_spec), so no cycle check."""
    if fallbacks and primary.kind != "model":
        raise InvalidField("fallbacks", "only a model deployment takes fallbacks")
    for i, fallback in enumerate(fallbacks):
        where = f"fallbacks[{i}].deployment"
        if fallback.deployment == name:
            raise InvalidField(where, "a deployment is not its own fallback")
        try:
            other = await deployments.find(session, tenant_id, fallback.deployment)
        except NotFound:
            raise InvalidField(where, f"no deployment named {fallback.deployment!r} "
                                      "(a fallback is one of your own deployments)") from None
        revisions = await deployments.revisions_of(session, other)
        why = mismatch(primary, deployments.serves(revisions[-1]))
        if why is not None:
            raise InvalidField(where, f"{fallback.deployment!r} {why}")


def _serves(config: RevisionConfig) -> Serves:
    return Serves(config.kind, str(config.engine.get("task", "generate")))


def _traffic_gpus(traffic: dict[str, int], revisions: list[Revision]) -> tuple[int, ...]:
    """The GPU count of each revision taking traffic."""
    return tuple(r.gpu_count for r in revisions if traffic.get(r.name, 0) > 0)
