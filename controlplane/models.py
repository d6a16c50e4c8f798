"""Every table of the control plane, as SQLAlchemy 2 ORM models.

Ids are uuid text. Money is NUMERIC; prices are per million tokens; times are
timestamptz in UTC. The schema only changes through migrations/.
"""
from __future__ import annotations

import uuid
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, Optional

from sqlalchemy import (ARRAY, BigInteger, DateTime, Float, ForeignKey, Index, Integer,
                        Numeric, String, Text, Uuid, text)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

PRICE = Numeric(18, 9)
MONEY = Numeric(30, 15)


def new_id() -> str:
    return str(uuid.uuid4())


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    type_annotation_map = {datetime: DateTime(timezone=True), str: Text}


def _id_column(*args: Any, **kw: Any) -> Mapped[str]:
    return mapped_column(Uuid(as_uuid=False), *args, **kw)


class Tenant(Base):
    __tablename__ = "tenants"
    id: Mapped[str] = _id_column(primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[str] = _id_column(primary_key=True, default=new_id)
    tenant_id: Mapped[str] = _id_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    prefix: Mapped[str] = mapped_column(unique=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[str]] = mapped_column(ARRAY(Text))
    name: Mapped[Optional[str]]
    requests_per_min: Mapped[Optional[int]]
    tokens_per_min: Mapped[Optional[int]]
    expires_at: Mapped[Optional[datetime]]
    revoked_at: Mapped[Optional[datetime]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Deployment(Base):
    """A tenant's named endpoint; scaling and the traffic split are mutable."""
    __tablename__ = "deployments"
    __table_args__ = (
        Index("uq_deployments_tenant_name", "tenant_id", "name", unique=True,
              postgresql_where=text("deleted_at IS NULL")),
    )
    id: Mapped[str] = _id_column(primary_key=True, default=new_id)
    tenant_id: Mapped[str] = _id_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str]
    min_replicas: Mapped[int] = mapped_column(Integer)
    max_replicas: Mapped[int] = mapped_column(Integer)
    target_concurrency: Mapped[int] = mapped_column(Integer)
    idle_timeout_s: Mapped[float] = mapped_column(Float)
    traffic: Mapped[dict[str, Any]] = mapped_column(JSONB)   # {"r1": 90, "r2": 10}
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[Optional[datetime]]


class Revision(Base):
    """Immutable: model, engine config, resources and pricing of one rollout."""
    __tablename__ = "revisions"
    __table_args__ = (Index("uq_revisions_deployment_number", "deployment_id", "number",
                            unique=True),)
    id: Mapped[str] = _id_column(primary_key=True, default=new_id)
    deployment_id: Mapped[str] = _id_column(ForeignKey("deployments.id", ondelete="CASCADE"))
    tenant_id: Mapped[str] = _id_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    model_uri: Mapped[str]
    architecture: Mapped[Optional[str]]
    # Read from config.json at deploy; NULL on revisions made before migration 0002.
    context_length: Mapped[Optional[int]] = mapped_column(Integer)   # max_position_embeddings
    vocab_size: Mapped[Optional[int]] = mapped_column(Integer)
    engine: Mapped[dict[str, Any]] = mapped_column(JSONB)
    gpu_memory_gb: Mapped[float] = mapped_column(Float)
    gpu_count: Mapped[int] = mapped_column(Integer)
    input_per_mtok: Mapped[Decimal] = mapped_column(PRICE)
    cached_input_per_mtok: Mapped[Decimal] = mapped_column(PRICE)
    output_per_mtok: Mapped[Decimal] = mapped_column(PRICE)
    gpu_second: Mapped[Decimal] = mapped_column(PRICE)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    @property
    def name(self) -> str:
        return f"r{self.number}"


class UsageEvent(Base):
    """One row per invocation. No foreign keys: the outbox may replay rows late."""
    __tablename__ = "usage_events"
    __table_args__ = (Index("ix_usage_tenant_started", "tenant_id", "started_at"),)
    invocation_id: Mapped[str] = _id_column(primary_key=True)
    request_id: Mapped[str]
    tenant_id: Mapped[str] = _id_column()
    api_key_id: Mapped[Optional[str]] = _id_column(nullable=True)
    deployment_id: Mapped[str] = _id_column()
    deployment_name: Mapped[str]
    revision_id: Mapped[str] = _id_column()
    revision_name: Mapped[str]
    model: Mapped[str]
    endpoint: Mapped[str]
    status: Mapped[str]                     # ok | partial | error
    http_status: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    cached_tokens: Mapped[int] = mapped_column(BigInteger)
    completion_tokens: Mapped[int] = mapped_column(BigInteger)
    queue_s: Mapped[Optional[float]] = mapped_column(Float)
    cold_start_s: Mapped[Optional[float]] = mapped_column(Float)
    ttft_s: Mapped[Optional[float]] = mapped_column(Float)
    total_s: Mapped[float] = mapped_column(Float)
    cost: Mapped[Decimal] = mapped_column(MONEY)
    replica_id: Mapped[Optional[str]]
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime]


class ReplicaLifetime(Base):
    """Start, ready and stop times of one replica, for GPU-second billing."""
    __tablename__ = "replica_lifetimes"
    replica_id: Mapped[str] = mapped_column(primary_key=True)
    revision_id: Mapped[str] = _id_column()
    deployment_id: Mapped[str] = _id_column()
    tenant_id: Mapped[str] = _id_column(index=True)
    gpu_count: Mapped[int] = mapped_column(Integer)
    slot_ids: Mapped[list[str]] = mapped_column(ARRAY(Text))
    state: Mapped[str]
    started_at: Mapped[datetime]
    ready_at: Mapped[Optional[datetime]]
    stopped_at: Mapped[Optional[datetime]]
    reason: Mapped[Optional[str]]
