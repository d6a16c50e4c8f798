"""Model uploads: one row per upload of a model folder, its files as JSON (each with the
object key and S3's upload id, which only the control plane sees)."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.fields import is_uuid
from controlplane.store.tables import ModelUpload
from controlplane.store.errors import AlreadyExists, NotFound


async def add(session: AsyncSession, upload: ModelUpload) -> ModelUpload:
    try:
        async with session.begin_nested():
            session.add(upload)
    except IntegrityError:
        raise AlreadyExists("upload", upload.name) from None
    return upload


async def find(session: AsyncSession, tenant_id: str, upload_id: str,
               for_update: bool = False) -> ModelUpload:
    """The tenant's upload (not deleted); another tenant's id is simply not found."""
    query = select(ModelUpload).where(ModelUpload.id == upload_id,
                                      ModelUpload.tenant_id == tenant_id,
                                      ModelUpload.status != "deleted")
    upload = await session.scalar(query.with_for_update() if for_update else query) \
        if is_uuid(upload_id) else None
    if upload is None:
        raise NotFound("upload", upload_id)
    return upload


async def list_for(session: AsyncSession, tenant_id: str) -> list[ModelUpload]:
    return list(await session.scalars(
        select(ModelUpload).where(ModelUpload.tenant_id == tenant_id,
                                  ModelUpload.status != "deleted")
        .order_by(ModelUpload.created_at)))


async def bytes_used(session: AsyncSession, tenant_id: str, now: datetime) -> int:
    """What counts against the tenant's upload quota: complete uploads and pending ones
    that have not expired."""
    u = ModelUpload
    total = await session.scalar(select(func.coalesce(func.sum(u.total_bytes), 0)).where(
        u.tenant_id == tenant_id,
        or_(u.status == "complete", and_(u.status == "pending", u.expires_at > now))))
    return int(total or 0)


def set_files(upload: ModelUpload, files: list[dict[str, Any]]) -> None:
    """JSONB is replaced whole, so SQLAlchemy sees the change."""
    upload.files = [dict(f) for f in files]
