"""Uploads of model folders without S3 credentials: presigned multipart URLs.

`create` starts one S3 multipart upload per file under the tenant's own prefix
(`tenants/<tenant id>/<upload name>/`, controlplane.deploy.model_sources) and hands back
a presigned URL per part; the tenant PUTs each part there and calls `complete`
with the parts' ETags; the control plane checks them against what S3 holds
(count, sizes, ETags) and completes the uploads. Each URL signs its part's length
(`Content-Length` is a signed header), so S3 refuses a part of any other size and
an upload never stores more than it declared. An upload never replaces an object:
`create` refuses a key that holds one (409), and `complete` writes each file with
`If-None-Match: *`, so an object that appeared meanwhile is kept and the completion
refused (409). Multipart uploads left pending past their expiry are aborted by
`abort_expired`, which the control plane runs periodically. Tenants see
their upload's id, its model URI and the part URLs, never the platform's
credentials, object keys or S3's upload ids. Sizes count against the tenant's
`max_upload_bytes` quota from the moment an upload starts (until it expires
pending or is deleted).
"""
from __future__ import annotations

import contextlib
import hashlib
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any, AsyncIterator, Optional

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.deploy.model_sources import TENANTS, own_key_prefix
from controlplane.store.tables import ModelUpload, utcnow
from controlplane.quotas import Quota, check_upload
from controlplane.store import quotas, uploads
from controlplane.store.errors import Conflict, InvalidField, Unavailable
from controlplane.deploy.upload_spec import PartPlan, UploadSpec, plan_parts

EXPIRY_GRACE_S = 300       # S3's clock and ours may differ; a completion may be under way
S3Client = Any            # an aiobotocore S3 client (the library has no type hints)
PartUrls = dict[str, list[str]]         # path -> presigned URL of each part, in order


@dataclass(frozen=True)
class UploadConfig:
    bucket: str
    part_bytes: int
    url_ttl_s: int
    upload_ttl_s: int
    default_quota: Quota


class Uploads:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], s3: S3Client,
                 config: UploadConfig):
        self.sessions = sessions
        self.s3 = s3
        self.config = config

    def model_uri(self, upload: ModelUpload) -> str:
        """The folder its files' keys lie in (uploads made before the tenants' namespace
        keep the folder they were written to)."""
        first = upload.files[0]
        return f"s3://{self.config.bucket}/{first['key'].removesuffix(first['path'])}"

    async def create(self, tenant_id: str, spec: UploadSpec) -> tuple[ModelUpload, PartUrls]:
        """The upload row and one multipart upload per file, under the tenant's lock (the
        quota counts what every upload of the tenant holds)."""
        now = utcnow()
        folder = f"{own_key_prefix(tenant_id)}{spec.name}/"
        async with self.sessions.begin() as session:
            await quotas.lock_tenant(session, tenant_id)
            for f in spec.files:
                await self._refuse_existing(f"{folder}{f.path}", f.path)
            quota = await quotas.quota_for(session, tenant_id, self.config.default_quota)
            check_upload(quota, await uploads.bytes_used(session, tenant_id, now),
                         spec.total_bytes)
            upload = await uploads.add(session, ModelUpload(
                tenant_id=tenant_id, name=spec.name, status="pending",
                total_bytes=spec.total_bytes, files=[], created_at=now,
                expires_at=now + timedelta(seconds=self.config.upload_ttl_s)))
            files = [await self._start(f"{folder}{f.path}", f.path, f.size)
                     for f in spec.files]
            uploads.set_files(upload, files)
        return upload, {f["path"]: await self._part_urls(f) for f in files}

    async def complete(self, tenant_id: str, upload_id: str,
                       parts: dict[str, list[tuple[int, str]]]) -> ModelUpload:
        """Checks every file's parts against S3 first, then completes them all."""
        async with self.sessions.begin() as session:
            upload = await uploads.find(session, tenant_id, upload_id, for_update=True)
            if upload.status == "complete":
                return upload
            if upload.expires_at <= utcnow():
                raise Conflict("upload_expired", "this upload expired; delete it and start again")
            _same_paths(upload.files, parts)
            pending = [f for f in upload.files
                       if not await self._stored(f, parts[f["path"]])]
            for entry in pending:
                index = next(i for i, f in enumerate(upload.files) if f["path"] == entry["path"])
                await self._check_parts(entry, parts[entry["path"]], f"files[{index}].parts")
            for entry in pending:
                await self._finish(entry, parts[entry["path"]])
            uploads.set_files(upload, [{**f, "completed": True} for f in upload.files])
            upload.status, upload.completed_at = "complete", utcnow()
        return upload

    async def delete(self, tenant_id: str, upload_id: str) -> None:
        """Aborts what is pending, deletes what was completed; the quota frees at once."""
        async with self.sessions.begin() as session:
            upload = await uploads.find(session, tenant_id, upload_id, for_update=True)
            for entry in upload.files:
                async with _storage():
                    if entry["completed"]:
                        await self.s3.delete_object(Bucket=self.config.bucket, Key=entry["key"])
                    else:
                        await self._abort(entry["key"], entry["s3_upload_id"])
            upload.status = "deleted"

    async def _start(self, key: str, path: str, size: int) -> dict[str, Any]:
        plan = plan_parts(size, self.config.part_bytes)
        async with _storage():
            started = await self.s3.create_multipart_upload(Bucket=self.config.bucket, Key=key)
        return {"path": path, "key": key, "size": size, **asdict(plan),
                "s3_upload_id": started["UploadId"], "completed": False}

    async def abort_expired(self, now: datetime) -> int:
        """Aborts the multipart uploads under the tenants' namespace started longer than an
        upload's lifetime (and a grace for clocks) before `now`, those of uploads that
        never completed and of creations cut halfway alike; how many it aborted."""
        before = now - timedelta(seconds=self.config.upload_ttl_s + EXPIRY_GRACE_S)
        aborted = 0
        async for key, upload_id, initiated in self._multipart_uploads(f"{TENANTS}/"):
            if initiated <= before:
                await self._abort(key, upload_id)
                aborted += 1
        return aborted

    async def _multipart_uploads(self, prefix: str) -> AsyncIterator[tuple[str, str, datetime]]:
        markers: dict[str, str] = {}
        while True:
            async with _storage():
                page = await self.s3.list_multipart_uploads(
                    Bucket=self.config.bucket, Prefix=prefix, **markers)
            for started in page.get("Uploads", []):
                yield started["Key"], started["UploadId"], started["Initiated"]
            if not page.get("IsTruncated"):
                return
            markers = {marker: page[given] for marker, given in
                       (("KeyMarker", "NextKeyMarker"), ("UploadIdMarker", "NextUploadIdMarker"))
                       if page.get(given)}

    async def _refuse_existing(self, key: str, path: str) -> None:
        if await self._head(key) is not None:
            raise Conflict("object_exists", f"{path}: an object is stored under this upload's "
                                            "name already; delete that upload or choose "
                                            "another name")

    async def _part_urls(self, entry: dict[str, Any]) -> list[str]:
        """ContentLength is signed: S3 refuses a body of any other length at this URL."""
        plan = PartPlan(entry["part_size"], entry["part_count"])
        return [await self.s3.generate_presigned_url(
            "upload_part", ExpiresIn=self.config.url_ttl_s,
            Params={"Bucket": self.config.bucket, "Key": entry["key"],
                    "UploadId": entry["s3_upload_id"], "PartNumber": number,
                    "ContentLength": plan.size_of(number, entry["size"])})
            for number in range(1, entry["part_count"] + 1)]

    async def _check_parts(self, entry: dict[str, Any], given: list[tuple[int, str]],
                           field: str) -> None:
        """The parts named are the plan's, each the size the plan says, with S3's ETags."""
        plan = PartPlan(entry["part_size"], entry["part_count"])
        expected = {n: plan.size_of(n, entry["size"]) for n in range(1, plan.part_count + 1)}
        if sorted(n for n, _ in given) != sorted(expected):
            raise InvalidField(field, f"{entry['path']}: parts 1 to {plan.part_count} are needed")
        held = await self._parts_held(entry)
        for number, etag in given:
            size, stored_etag = held.get(number, (None, None))
            if size != expected[number] or stored_etag != etag:
                raise InvalidField(field, f"{entry['path']}: part {number} is missing, of the "
                                          f"wrong size or has another ETag")

    async def _parts_held(self, entry: dict[str, Any]) -> dict[int, tuple[int, str]]:
        held: dict[int, tuple[int, str]] = {}
        marker = 0
        while True:
            async with _storage():
                page = await self.s3.list_parts(
                    Bucket=self.config.bucket, Key=entry["key"], UploadId=entry["s3_upload_id"],
                    PartNumberMarker=marker)
            for part in page.get("Parts", []):
                held[part["PartNumber"]] = (part["Size"], part["ETag"].strip('"'))
            if not page.get("IsTruncated"):
                return held
            marker = page["NextPartNumberMarker"]

    async def _finish(self, entry: dict[str, Any], given: list[tuple[int, str]]) -> None:
        parts = [{"PartNumber": n, "ETag": f'"{etag}"'} for n, etag in sorted(given)]
        try:
            async with _storage():
                await self.s3.complete_multipart_upload(
                    Bucket=self.config.bucket, Key=entry["key"], UploadId=entry["s3_upload_id"],
                    MultipartUpload={"Parts": parts}, IfNoneMatch="*")
        except Unavailable as exc:
            if _code(exc.__cause__ or exc) == "PreconditionFailed":
                raise Conflict("object_exists", f"{entry['path']}: an object was stored under "
                                                "this upload's key meanwhile; it was kept and "
                                                "this upload not completed") from None
            raise

    async def _stored(self, entry: dict[str, Any], given: list[tuple[int, str]]) -> bool:
        """The file is whole in S3 already, made of these very parts (an earlier completion
        that got that far); an object of other parts is not this upload's."""
        head = await self._head(entry["key"])
        expected = multipart_etag(given)
        return head is not None and expected is not None and \
            str(head.get("ETag", "")).strip('"') == expected

    async def _head(self, key: str) -> Optional[dict[str, Any]]:
        """The object's HEAD; None when there is none."""
        try:
            return dict(await self.s3.head_object(Bucket=self.config.bucket, Key=key))
        except Exception as exc:  # noqa: BLE001 - not there yet is the usual answer
            if _code(exc) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise Unavailable(f"object storage did not answer ({type(exc).__name__})") from exc

    async def _abort(self, key: str, upload_id: str) -> None:
        try:
            await self.s3.abort_multipart_upload(Bucket=self.config.bucket, Key=key,
                                                 UploadId=upload_id)
        except Exception as exc:  # noqa: BLE001 - already gone is fine; others re-raised
            if _code(exc) not in ("NoSuchUpload", "404"):
                raise


def multipart_etag(given: list[tuple[int, str]]) -> Optional[str]:
    """S3's ETag of an object completed from parts of these ETags: the MD5 of their
    digests, then "-" and how many there are; None when an ETag is no MD5."""
    try:
        digests = b"".join(bytes.fromhex(etag) for _, etag in sorted(given))
    except ValueError:
        return None
    return f"{hashlib.md5(digests).hexdigest()}-{len(given)}"


def _same_paths(files: list[dict[str, Any]], parts: dict[str, list[tuple[int, str]]]) -> None:
    expected = {f["path"] for f in files}
    if set(parts) != expected:
        raise InvalidField("files", f"name every file of the upload once: {sorted(expected)}")


@contextlib.asynccontextmanager
async def _storage() -> AsyncIterator[None]:
    """S3 failures as Unavailable (503): the tenant may retry; nothing here is its fault."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (BotoCoreError, ClientError, OSError) as exc:
        raise Unavailable(f"object storage did not answer ({_code(exc) or type(exc).__name__})") \
            from exc


def _code(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


async def open_s3_client(stack: contextlib.AsyncExitStack, endpoint: str | None,
                         region: str, access_key: str | None,
                         secret_key: str | None) -> S3Client:
    """The control plane's own S3 client (uploads), living as long as `stack`."""
    from aiobotocore.config import AioConfig
    from aiobotocore.session import get_session

    return await stack.enter_async_context(get_session().create_client(
        "s3", endpoint_url=endpoint, region_name=region, aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        config=AioConfig(s3={"addressing_style": "path"}, signature_version="s3v4",
                         connect_timeout=10, read_timeout=60)))
