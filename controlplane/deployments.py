"""Deployments and their immutable revisions in Postgres, always scoped by tenant."""
from __future__ import annotations

from dataclasses import asdict
from decimal import Decimal
from typing import Optional

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.deployment_spec import (DeploymentPatch, DeploymentSpec, Resources,
                                          RevisionConfig, Scaling, check_parallelism, parse_engine,
                                          parse_model_uri, parse_pricing, parse_resources,
                                          parse_scaling)
from controlplane.errors import ApiError
from controlplane.models import Deployment, Revision, utcnow
from controlplane.pricing import PRICE_QUANTUM, Pricing
from pool.api import RevisionSpec


async def create(session: AsyncSession, tenant_id: str, spec: DeploymentSpec,
                 architecture: Optional[str]) -> tuple[Deployment, list[Revision]]:
    deployment = Deployment(tenant_id=tenant_id, name=spec.name, traffic={"r1": 100},
                            **asdict(spec.scaling))
    session.add(deployment)
    try:
        await session.flush()
    except IntegrityError:
        raise ApiError(409, f"deployment {spec.name!r} already exists",
                       code="deployment_exists") from None
    revision = _new_revision(deployment, 1, spec.revision, architecture)
    session.add(revision)
    await session.flush()
    return deployment, [revision]


async def find(session: AsyncSession, tenant_id: str, name: str,
               for_update: bool = False) -> Deployment:
    """The tenant's live deployment; another tenant's name is simply not found (404)."""
    query = select(Deployment).where(Deployment.tenant_id == tenant_id, Deployment.name == name,
                                     Deployment.deleted_at.is_(None))
    if for_update:
        query = query.with_for_update()
    deployment = await session.scalar(query)
    if deployment is None:
        raise ApiError(404, f"deployment {name!r} not found", code="deployment_not_found")
    return deployment


async def revisions_of(session: AsyncSession, deployment: Deployment) -> list[Revision]:
    rows = await session.scalars(select(Revision).where(Revision.deployment_id == deployment.id)
                                 .order_by(Revision.number))
    return list(rows)


async def list_for(session: AsyncSession, tenant_id: str) -> list[tuple[Deployment, list]]:
    deployments = list(await session.scalars(
        select(Deployment).where(Deployment.tenant_id == tenant_id,
                                 Deployment.deleted_at.is_(None)).order_by(Deployment.name)))
    return [(d, await revisions_of(session, d)) for d in deployments]


def revision_config(revision: Revision) -> RevisionConfig:
    return RevisionConfig(
        model_uri=revision.model_uri,
        resources=Resources(revision.gpu_memory_gb, revision.gpu_count),
        engine=dict(revision.engine),
        pricing=pricing_of(revision))


def patched_config(base: RevisionConfig, patch: DeploymentPatch) -> RevisionConfig:
    """The revision config a PATCH asks for (validated against the current one)."""
    return check_parallelism(RevisionConfig(
        model_uri=parse_model_uri(patch.model_uri) if patch.model_uri else base.model_uri,
        resources=(parse_resources(patch.resources, base.resources)
                   if patch.resources is not None else base.resources),
        engine=(parse_engine(_merge(base.engine, patch.engine))
                if patch.engine is not None else base.engine),
        pricing=(parse_pricing(patch.pricing, base.pricing)
                 if patch.pricing is not None else base.pricing)))


def _merge(base: dict, change: dict) -> dict:
    """JSON merge patch: given keys replace, null removes."""
    merged = {**base, **change}
    return {k: v for k, v in merged.items() if v is not None}


def apply_scaling(deployment: Deployment, patch: DeploymentPatch) -> None:
    if patch.scaling is None:
        return
    scaling = parse_scaling(patch.scaling, scaling_of(deployment))
    for name, value in asdict(scaling).items():
        setattr(deployment, name, value)


def add_revision(session: AsyncSession, deployment: Deployment, revisions: list[Revision],
                 config: RevisionConfig, architecture: Optional[str], promote: bool) -> Revision:
    revision = _new_revision(deployment, revisions[-1].number + 1, config, architecture)
    session.add(revision)
    if promote:
        deployment.traffic = {revision.name: 100}
    return revision


def _new_revision(deployment: Deployment, number: int, config: RevisionConfig,
                  architecture: Optional[str]) -> Revision:
    return Revision(deployment_id=deployment.id, tenant_id=deployment.tenant_id, number=number,
                    model_uri=config.model_uri, architecture=architecture,
                    engine=config.engine, gpu_memory_gb=config.resources.gpu_memory_gb,
                    gpu_count=config.resources.gpu_count, **asdict(config.pricing))


def touch(deployment: Deployment) -> None:
    deployment.updated_at = utcnow()


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


def view(deployment: Deployment, revisions: list[Revision]) -> dict:
    return {
        "id": deployment.id, "name": deployment.name,
        "scaling": asdict(scaling_of(deployment)),
        "traffic": dict(deployment.traffic),
        "revisions": [revision_view(r) for r in revisions],
        "created_at": deployment.created_at.isoformat(),
        "updated_at": deployment.updated_at.isoformat(),
    }


def revision_view(revision: Revision) -> dict:
    return {
        "name": revision.name, "id": revision.id, "model_uri": revision.model_uri,
        "architecture": revision.architecture, "engine": dict(revision.engine),
        "resources": {"gpu_memory_gb": revision.gpu_memory_gb, "gpu_count": revision.gpu_count},
        "pricing": {k: str(Decimal(v).quantize(PRICE_QUANTUM))
                    for k, v in asdict(pricing_of(revision)).items()},
        "created_at": revision.created_at.isoformat(),
    }
