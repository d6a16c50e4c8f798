"""Deployments and their immutable revisions, always scoped by tenant.

A revision also keeps what the deploy read from the model (architecture,
context length, vocabulary size), so the gateway can check a request against
the model without a replica. Revisions written before migration 0002 have no
context length or vocabulary size (NULL); readers fall back as documented where
they read them (`controlplane.gateway.llm.FALLBACK_CONTEXT_LEN`). It keeps the ETag
and size of every object its deploy read (`pinned_objects`), which the pool's
cold starts hold the bytes to (`RevisionSpec.pins`).
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Optional

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.deploy.deployment_spec import NAME, DeploymentSpec, Resources, RevisionConfig, Scaling
from controlplane.deploy.fallback_spec import Fallback, Serves, from_stored
from controlplane.store.tables import Deployment, Revision, utcnow
from controlplane.store import names
from controlplane.store.errors import AlreadyExists, Conflict, NotFound
from pool.api import FUNCTION_ARCHITECTURE, ModelInfo, PinnedObject, Pins, ReplicaKind, RevisionSpec, TenantQuota
from spec.engine_options import ChosenOptions

async def create(session: AsyncSession, tenant_id: str, spec: DeploymentSpec,
                 model: ModelInfo, pins: Pins) -> tuple[Deployment, list[Revision]]:
    await names.check_free(session, tenant_id, spec.name, "deployment")     # not an adapter's
    deployment = Deployment(tenant_id=tenant_id, name=spec.name, traffic={"r1": 100},
                            fallbacks=[f.as_json() for f in spec.fallbacks], **asdict(spec.scaling))
    session.add(deployment)
    try:
        await session.flush()
    except IntegrityError:
        raise AlreadyExists("deployment", spec.name) from None
    revision = _new_revision(deployment, 1, spec.revision, model, pins)
    session.add(revision)
    await session.flush()
    return deployment, [revision]


async def find(session: AsyncSession, tenant_id: str, name: str,
               for_update: bool = False) -> Deployment:
    """The tenant's live deployment; another tenant's name is simply not found."""
    if not NAME.match(name):
        raise NotFound("deployment", name)
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


async def change(session: AsyncSession, deployment: Deployment, revisions: list[Revision],
                 scaling: Scaling, new_revision: Optional[tuple[RevisionConfig, ModelInfo, Pins]],
                 promote: bool, fallbacks: Optional[tuple[Fallback, ...]] = None
                 ) -> tuple[Deployment, list[Revision]]:
    """A PATCH of a deployment the caller has locked (`find(..., for_update=True)`) and
    read `revisions` of: scaling and fallbacks (None: unchanged) in place; a changed
    config makes a revision (taking all traffic when `promote`)."""
    for field_name, value in asdict(scaling).items():
        setattr(deployment, field_name, value)
    if fallbacks is not None:
        deployment.fallbacks = [f.as_json() for f in fallbacks]
    if new_revision is not None:
        config, model, pins = new_revision
        revision = _new_revision(deployment, revisions[-1].number + 1, config, model, pins)
        session.add(revision)
        revisions.append(revision)
        if promote:
            deployment.traffic = {revision.name: 100}
    deployment.updated_at = utcnow()
    await session.flush()
    return deployment, revisions


async def set_traffic(session: AsyncSession, deployment: Deployment,
                      traffic: dict[str, int]) -> None:
    """A new split for a deployment the caller has locked."""
    deployment.traffic = traffic
    deployment.updated_at = utcnow()
    await session.flush()


async def set_shared(session: AsyncSession, deployment: Deployment, shared: bool) -> None:
    """Makes a deployment the caller has locked one of the operator's catalogue bases
    (every tenant may call it and attach adapters to it), or takes it out; a name is
    shared by one live deployment at most, so a base's name says which one it is."""
    if shared and not deployment.shared:
        await session.execute(select(func.pg_advisory_xact_lock(func.hashtext(f"shared:{deployment.name}"))))
        if await find_shared(session, deployment.name) is not None:
            raise Conflict("shared_name_taken", f"name: another deployment named {deployment.name!r} "
                                                "is shared already; a shared name says which base it is")
    deployment.shared = shared
    deployment.updated_at = utcnow()
    await session.flush()


async def find_shared(session: AsyncSession, name: str) -> Optional[Deployment]:
    """The live shared deployment of that name, whoever's it is."""
    if not NAME.match(name):
        return None
    return await session.scalar(select(Deployment).where(
        Deployment.name == name, Deployment.shared.is_(True), Deployment.deleted_at.is_(None))
        .order_by(Deployment.created_at).limit(1))


async def delete(session: AsyncSession, tenant_id: str, name: str) -> str:
    """Marks it deleted; returns its id."""
    deployment = await find(session, tenant_id, name, for_update=True)
    deployment.deleted_at = utcnow()
    return deployment.id


def _new_revision(deployment: Deployment, number: int, config: RevisionConfig,
                  model: ModelInfo, pins: Pins) -> Revision:
    return Revision(deployment_id=deployment.id, tenant_id=deployment.tenant_id, number=number,
                    model_uri=config.model_uri, architecture=model.architecture,
                    context_length=model.max_position_embeddings or None,
                    vocab_size=model.vocab_size or None,
                    pinned_objects={uri: {"etag": p.etag, "size": p.size} for uri, p in pins.items()},
                    weights=dict(model.quantization) or None,
                    engine=config.engine, gpu_memory_gb=config.resources.gpu_memory_gb,
                    gpu_count=config.resources.gpu_count)


def revision_config(revision: Revision) -> RevisionConfig:
    return RevisionConfig(
        model_uri=revision.model_uri,
        resources=Resources(revision.gpu_memory_gb, revision.gpu_count),
        engine=dict(revision.engine), kind=kind_of(revision))


def kind_of(revision: Revision) -> ReplicaKind:
    """A revision's kind is what its deploy found under model_uri (no column of its own)."""
    return "function" if revision.architecture == FUNCTION_ARCHITECTURE else "model"


def fallbacks_of(deployment: Deployment) -> tuple[Fallback, ...]:
    return from_stored(deployment.fallbacks or [])


def serves(revision: Revision) -> Serves:
    """What a deployment whose newest revision is `revision` answers."""
    return Serves(kind_of(revision), str(revision.engine.get("task", "generate")))


def scaling_of(deployment: Deployment) -> Scaling:
    return Scaling(deployment.min_replicas, deployment.max_replicas,
                   deployment.target_concurrency, deployment.idle_timeout_s,
                   deployment.sleep_timeout_s, deployment.prefetch)


def revision_spec(deployment: Deployment, revision: Revision, quota: TenantQuota) -> RevisionSpec:
    """What the pool runs: the revision, its deployment's scaling and its tenant's quota."""
    return RevisionSpec(
        revision_id=revision.id, deployment_id=deployment.id, tenant_id=deployment.tenant_id,
        model_uri=revision.model_uri, gpu_memory_gb=revision.gpu_memory_gb,
        gpu_count=revision.gpu_count, min_replicas=deployment.min_replicas,
        max_replicas=deployment.max_replicas,
        target_concurrency=deployment.target_concurrency,
        idle_timeout_s=deployment.idle_timeout_s, engine=ChosenOptions(revision.engine), quota=quota,
        kind=kind_of(revision), sleep_timeout_s=deployment.sleep_timeout_s,
        prefetch=deployment.prefetch, pins=pins_of(revision))


def pins_of(revision: Revision) -> Pins:
    """The objects the revision was deployed with (none kept before migration 0012)."""
    return {uri: PinnedObject(str(p["etag"]), int(p["size"]))
            for uri, p in (revision.pinned_objects or {}).items()}


async def names_of(session: AsyncSession, tenant_id: str) -> dict[str, str]:
    """Id -> name of the tenant's live deployments."""
    rows = await session.execute(select(Deployment.id, Deployment.name).where(
        Deployment.tenant_id == tenant_id, Deployment.deleted_at.is_(None)))
    return {deployment_id: name for deployment_id, name in rows.tuples()}
