"""One S3 object into a file: parallel ranged GETs (part size and concurrency from the
settings, every part `If-Match` the listed ETag, retried with backoff), each chunk
written at its offset, then verified (size always; the MD5 for single-part ETags,
hashed in order while later parts still download; a multipart ETag `<md5>-<n>` is not
a content MD5, so those are verified by size only). The SHA-256 hashed on the way is
what the cache keeps to verify a hit later.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path
from typing import Awaitable, Callable, Iterable, Optional, TypeVar

from pool.api import ColdStartFailed
from pool.s3 import MISMATCH_CODES, MISSING_CODES, S3Client, S3Object, ShortRead, error_code, with_retries
from pool.settings import PoolSettings

T = TypeVar("T")
CHUNK = 1024 * 1024


class Downloader:
    def __init__(self, client: S3Client, settings: PoolSettings):
        self.client = client
        self.settings = settings
        self._parts = asyncio.Semaphore(settings.download_concurrency)

    async def retry(self, call: Callable[[], Awaitable[T]]) -> T:
        s = self.settings
        return await with_retries(call, attempts=s.s3_attempts, base_s=s.s3_backoff_base_s,
                                  cap_s=s.s3_backoff_cap_s)

    async def download(self, obj: S3Object, dest: Path) -> str:
        """Parallel ranged GETs of one object into dest, then verified; its SHA-256."""
        ranges = part_ranges(obj.size, self.settings.part_size_bytes)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, obj.size)
            hasher = OrderedHasher(dest, len(ranges))
            tasks = [asyncio.ensure_future(self._part(obj, fd, i, rng, hasher)) for i, rng in enumerate(ranges)]
            hashing = asyncio.ensure_future(hasher.run(ranges))
            try:
                written = sum(await asyncio.gather(*tasks))
                md5_hex, sha256_hex = await hashing
            except BaseException:
                for t in tasks + [hashing]:
                    t.cancel()
                await asyncio.gather(*tasks, hashing, return_exceptions=True)
                raise
        finally:
            os.close(fd)
        check_md5 = self.settings.verify_md5 and not obj.is_multipart_etag
        verify(obj, written, dest.stat().st_size, md5_hex if check_md5 else None)
        return sha256_hex

    async def _part(self, obj: S3Object, fd: int, index: int, rng: tuple[int, int],
                    hasher: "OrderedHasher") -> int:
        async with self._parts:
            n = await self.retry(lambda: self._get_range(obj, fd, rng))
        hasher.done(index)
        return n

    async def _get_range(self, obj: S3Object, fd: int, rng: tuple[int, int]) -> int:
        start, end = rng
        offset = start
        try:
            resp = await self.client.get_object(Bucket=obj.bucket, Key=obj.key,
                                                Range=f"bytes={start}-{end}", IfMatch=f'"{obj.etag}"')
            async with resp["Body"] as body:
                # each chunk straight to its offset: no join of the part in memory
                async for chunk in body.iter_chunks(CHUNK):
                    offset += os.pwrite(fd, chunk, offset)
        except Exception as exc:  # noqa: BLE001 - classified into a cold-start reason
            raise_clear(obj, exc)
        if offset != end + 1:
            raise ShortRead(f"{obj.uri} bytes {start}-{end}: got {offset - start}")
        return offset - start


def raise_clear(obj: S3Object, exc: Exception) -> None:
    code = error_code(exc)
    if code in MISSING_CODES:
        raise ColdStartFailed(f"missing object {obj.uri}") from exc
    if code in MISMATCH_CODES:
        raise ColdStartFailed(f"ETag mismatch for {obj.uri}: changed since listed (expected {obj.etag})") from exc
    raise exc


def part_ranges(size: int, part: int) -> list[tuple[int, int]]:
    return [(start, min(size, start + part) - 1) for start in range(0, size, part)]


def verify(obj: S3Object, written: int, on_disk: int, md5_hex: Optional[str]) -> None:
    if written != obj.size or on_disk != obj.size:
        raise ColdStartFailed(f"size mismatch for {obj.uri}: expected {obj.size}, got {written}")
    if md5_hex is not None and md5_hex != obj.etag:
        raise ColdStartFailed(f"ETag mismatch for {obj.uri}: expected {obj.etag}, content md5 {md5_hex}")


class OrderedHasher:
    """MD5 and SHA-256 of a file whose parts arrive out of order: hashes each contiguous
    prefix as it lands."""

    def __init__(self, path: Path, parts: int):
        self.path = path
        self.events = [asyncio.Event() for _ in range(parts)]

    def done(self, index: int) -> None:
        self.events[index].set()

    async def run(self, ranges: list[tuple[int, int]]) -> tuple[str, str]:
        hashes = (hashlib.md5(), hashlib.sha256())
        loop = asyncio.get_running_loop()
        with open(self.path, "rb") as f:
            for event, (start, end) in zip(self.events, ranges):
                await event.wait()
                await loop.run_in_executor(None, _hash_range, f.fileno(), start, end, hashes)
        return hashes[0].hexdigest(), hashes[1].hexdigest()


def _hash_range(fd: int, start: int, end: int, hashes: Iterable["hashlib._Hash"]) -> None:
    step = 4 * 1024 * 1024
    for offset in range(start, end + 1, step):
        chunk = os.pread(fd, min(step, end + 1 - offset), offset)
        for h in hashes:
            h.update(chunk)
