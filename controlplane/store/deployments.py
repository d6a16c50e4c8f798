"""Deployments and their immutable revisions, always scoped by tenant.

A revision also keeps what the deploy read from the model (architecture,
context length, vocabulary size), so the gateway can check a request against
the model without a replica. Revisions written before migration 0002 have no
context length or vocabulary size (NULL); readers fall back as documented where
they read them (`controlplane.gateway.FALLBACK_CONTEXT_LEN`).
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable, Optional

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.deployment_spec import (DeploymentSpec, Resources, RevisionConfig, Scaling,
                                          parse_scaling)
from controlplane.models import Deployment, Revision, utcnow
from controlplane.pricing import Pricing
from controlplane.store.errors import AlreadyExists, NotFound
from pool.api import ModelInfo, RevisionSpec

# (the deployment, its revision names) -> the new split; raises InvalidField
SplitRule = Callable[[Deployment, list[str]], dict[str, int]]


async def create(session: AsyncSession, tenant_id: str, spec: DeploymentSpec,
                 model: ModelInfo) -> tuple[Deployment, list[Revision]]:
    deployment = Deployment(tenant_id=tenant_id, name=spec.name, traffic={"r1": 100},
                            **asdict(spec.scaling))
    session.add(deployment)
    try:
        await session.flush()
    except IntegrityError:
        raise AlreadyExists("deployment", spec.name) from None
    revision = _new_revision(deployment, 1, spec.revision, model)
    session.add(revision)
    await session.flush()
    return deployment, [revision]


async def find(session: AsyncSession, tenant_id: str, name: str,
               for_update: bool = False) -> Deployment:
    """The tenant's live deployment; another tenant's name is simply not found."""
    query = select(Deployment).where(Deployment.tenant_id == tenant_id, Deployment.name == name,
                                     Deployment.deleted_at.is_(None))
    if for_update:
        query = query.with_for_update()
    deployment = await session.scalar(query)
    if deployment is None:
        raise NotFound("deployment", name)
    return deployment


async def revisions_of(session: AsyncSession, deployment: Deployment) -> list[Revision]:
    rows = await session.scalars(select(Revision).where(Revision.deployment_id == deployment.id)
                                 .order_by(Revision.number))
    return list(rows)


async def find_with_revisions(session: AsyncSession, tenant_id: str,
                              name: str) -> tuple[Deployment, list[Revision]]:
    deployment = await find(session, tenant_id, name)
    return deployment, await revisions_of(session, deployment)


async def list_for(session: AsyncSession,
                   tenant_id: str) -> list[tuple[Deployment, list[Revision]]]:
    deployments = list(await session.scalars(
        select(Deployment).where(Deployment.tenant_id == tenant_id,
                                 Deployment.deleted_at.is_(None)).order_by(Deployment.name)))
    return [(d, await revisions_of(session, d)) for d in deployments]


async def change(session: AsyncSession, tenant_id: str, name: str,
                 scaling: Optional[dict[str, Any]],
                 new_revision: Optional[tuple[RevisionConfig, ModelInfo]],
                 promote: bool) -> tuple[Deployment, list[Revision]]:
    """A PATCH under the row lock: scaling in place; a changed config makes a revision
    (taking all traffic when `promote`)."""
    deployment = await find(session, tenant_id, name, for_update=True)
    revisions = await revisions_of(session, deployment)
    if scaling is not None:
        for field_name, value in asdict(parse_scaling(scaling, scaling_of(deployment))).items():
            setattr(deployment, field_name, value)
    if new_revision is not None:
        config, model = new_revision
        revision = _new_revision(deployment, revisions[-1].number + 1, config, model)
        session.add(revision)
        revisions.append(revision)
        if promote:
            deployment.traffic = {revision.name: 100}
    deployment.updated_at = utcnow()
    await session.flush()
    return deployment, revisions


async def set_traffic(session: AsyncSession, tenant_id: str, name: str,
                      rule: SplitRule) -> tuple[Deployment, list[Revision]]:
    """The split `rule` computes from the locked deployment and its revision names."""
    deployment = await find(session, tenant_id, name, for_update=True)
    revisions = await revisions_of(session, deployment)
    deployment.traffic = rule(deployment, [r.name for r in revisions])
    deployment.updated_at = utcnow()
    await session.flush()
    return deployment, revisions


async def delete(session: AsyncSession, tenant_id: str, name: str) -> None:
    deployment = await find(session, tenant_id, name, for_update=True)
    deployment.deleted_at = utcnow()


def _new_revision(deployment: Deployment, number: int, config: RevisionConfig,
                  model: ModelInfo) -> Revision:
    return Revision(deployment_id=deployment.id, tenant_id=deployment.tenant_id, number=number,
                    model_uri=config.model_uri, architecture=model.architecture,
                    context_length=model.max_position_embeddings or None,
                    vocab_size=model.vocab_size or None,
                    engine=config.engine, gpu_memory_gb=config.resources.gpu_memory_gb,
                    gpu_count=config.resources.gpu_count, **asdict(config.pricing))


def revision_config(revision: Revision) -> RevisionConfig:
    return RevisionConfig(
        model_uri=revision.model_uri,
        resources=Resources(revision.gpu_memory_gb, revision.gpu_count),
        engine=dict(revision.engine),
        pricing=pricing_of(revision))


def scaling_of(deployment: Deployment) -> Scaling:
    return Scaling(deployment.min_replicas, deployment.max_replicas,
                   deployment.target_concurrency, deployment.idle_timeout_s)


def pricing_of(revision: Revision) -> Pricing:
    return Pricing(revision.input_per_mtok, revision.cached_input_per_mtok,
                   revision.output_per_mtok, revision.gpu_second)


def revision_spec(deployment: Deployment, revision: Revision) -> RevisionSpec:
    return RevisionSpec(
        revision_id=revision.id, deployment_id=deployment.id, tenant_id=deployment.tenant_id,
        model_uri=revision.model_uri, gpu_memory_gb=revision.gpu_memory_gb,
        gpu_count=revision.gpu_count, min_replicas=deployment.min_replicas,
        max_replicas=deployment.max_replicas,
        target_concurrency=deployment.target_concurrency,
        idle_timeout_s=deployment.idle_timeout_s, engine=dict(revision.engine))
