"""The Files API's storage: a file's bytes in the models bucket under its tenant's own
prefix (`tenants/<tenant id>/batch-files/<file id>`), its metadata in `batch_files`.
Tenants see the id, name, size and purpose, never the key. Another tenant's file is
not found (404). An upload past `max_bytes` is refused before anything is stored."""
from __future__ import annotations

import contextlib
import uuid
from typing import AsyncIterator, Optional

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.deploy.model_sources import own_key_prefix
from controlplane.batch.input_lines import invalid
from controlplane.deploy.uploads import S3Client
from controlplane.store import batches as store
from controlplane.store.errors import Unavailable
from controlplane.store.tables import BatchFile, utcnow

UPLOAD_PURPOSES = ("batch",)
OUTPUT_PURPOSE = "batch_output"


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


class BatchFiles:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], s3: S3Client, bucket: str,
                 max_bytes: int):
        self.sessions, self.s3, self.bucket, self.max_bytes = sessions, s3, bucket, max_bytes

    async def upload(self, tenant_id: str, filename: str, purpose: str, data: bytes) -> BatchFile:
        """A tenant's own file (purpose `batch`): InvalidField naming what is wrong."""
        if purpose not in UPLOAD_PURPOSES:
            raise invalid("purpose", f"must be one of {', '.join(UPLOAD_PURPOSES)}")
        if not data:
            raise invalid("file", "is empty")
        if len(data) > self.max_bytes:
            raise invalid("file", f"larger than {self.max_bytes} bytes")
        return await self.write(tenant_id, new_file_id(), filename, purpose, data)

    async def write(self, tenant_id: str, file_id: str, filename: str, purpose: str,
                    data: bytes) -> BatchFile:
        """The object, then its row: written again under the same id, it is replaced
        whole and keeps its row (a batch finalized twice after a restart)."""
        key = f"{own_key_prefix(tenant_id)}batch-files/{file_id}"
        async with _storage():
            await self.s3.put_object(Bucket=self.bucket, Key=key, Body=data)
        row = BatchFile(id=file_id, tenant_id=tenant_id, purpose=purpose, filename=filename,
                        bytes=len(data), object_key=key, created_at=utcnow())
        async with self.sessions.begin() as session:
            await store.add_file(session, row)
        return row

    async def get(self, tenant_id: str, file_id: str) -> BatchFile:
        async with self.sessions() as session:
            return await store.find_file(session, tenant_id, file_id)

    async def list(self, tenant_id: str, purpose: Optional[str], limit: int) -> list[BatchFile]:
        async with self.sessions() as session:
            return await store.list_files(session, tenant_id, purpose, limit)

    async def content(self, tenant_id: str, file_id: str) -> bytes:
        return await self.read(await self.get(tenant_id, file_id))

    async def read(self, row: BatchFile) -> bytes:
        async with _storage():
            got = await self.s3.get_object(Bucket=self.bucket, Key=row.object_key)
            async with got["Body"] as body:
                data: bytes = await body.read()
        return data

    async def delete(self, tenant_id: str, file_id: str) -> None:
        """The row first: a file half deleted is gone for its tenant, never half there."""
        async with self.sessions.begin() as session:
            row = await store.find_file(session, tenant_id, file_id)
            await store.delete_file(session, row.id)
        async with _storage():
            await self.s3.delete_object(Bucket=self.bucket, Key=row.object_key)


@contextlib.asynccontextmanager
async def _storage() -> AsyncIterator[None]:
    """S3 failures as Unavailable (503): the tenant may retry."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (BotoCoreError, ClientError, OSError) as exc:
        raise Unavailable(f"object storage did not answer ({type(exc).__name__})") from exc
