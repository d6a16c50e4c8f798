"""Weights from S3 into a local content cache shared by the replicas of a node.

Each object is downloaded into a temp file (pool/weights/download.py: parallel
ranged GETs, each `If-Match` its listed ETag, verified) and renamed atomically
into the cache (pool/weights/cache.py: LRU past its
budget, entries in use pinned, a hit re-hashed when its files' stat changed).
A failed or partial download is deleted and never enters the cache. Bytes
that changed are evicted and fetched again: the same size is not the same
model, and an entry is shared by every revision that names the same object.

A revision fetches the objects its deploy read (RevisionSpec.pins): another
ETag or size under a pinned key is a ColdStartFailed, and objects added under
the prefix since are left out; with every GET `If-Match` the listed ETag, what
loads is what placement was sized for at deploy.

A model folder for the runtime is a directory of symlinks into the cache; a
`.gguf` object's is the folder imported from it, a cache entry of its own
keyed by the object's ETag (pool/weights/gguf.py).
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import time
import uuid
from types import MappingProxyType
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Awaitable, Callable, Iterable, Optional, TypeVar

from pool.weights import gguf
from pool.api import ColdStartFailed, PinnedObject, Pins
from pool.weights.gguf import is_gguf_uri
from pool.weights.cache import WeightCache, digests_of, entry_key
from pool.weights.download import Downloader
from pool.weights.inspection import FUNCTION_MANIFEST
from pool.s3 import (S3Client, S3Object, list_objects, parse_uri)
from pool.settings import PoolSettings

log = logging.getLogger(__name__)
T = TypeVar("T")

SKIP_SUFFIXES = (".bin", ".pt", ".pth", ".msgpack", ".h5", ".ckpt", ".md", ".gitattributes")
NO_PINS: Pins = MappingProxyType({})


@dataclass(frozen=True)
class ModelFiles:
    model_dir: Path
    keys: tuple[str, ...]           # cache entries this folder links to (pinned)
    downloaded_bytes: int
    cached_bytes: int
    seconds: float


@dataclass(frozen=True)
class CachedModel:
    """A model put into the cache with no folder made and nothing pinned (a prefetch)."""
    keys: tuple[str, ...]           # the cache entries it is made of
    downloaded_bytes: int


class WeightStore:
    """Fetches model folders from S3 through the cache; dedupes concurrent fetches."""

    def __init__(self, client: S3Client, cache: WeightCache, settings: PoolSettings, origin: str = ""):
        self.client = client
        self.cache = cache
        self.settings = settings
        self.origin = origin            # S3Access.origin of the client's credentials
        self.downloader = Downloader(client, settings)
        self._inflight: dict[str, Shared] = {}

    async def list_model(self, model_uri: str, pins: Pins = NO_PINS) -> list[S3Object]:
        """The objects to fetch: those its revision pinned, each as it was deployed."""
        objects = [replace(o, origin=self.origin) for o in await self._list(model_uri)]
        refuse_changed(model_uri, {o.uri: PinnedObject(o.etag, o.size) for o in objects}, pins)
        return objects if not pinned_under(model_uri, pins) else [o for o in objects if o.uri in pins]

    async def _list(self, model_uri: str) -> list[S3Object]:
        if is_gguf_uri(model_uri):
            return [await self.downloader.retry(lambda: gguf.head(self.client, model_uri))]
        bucket, prefix = parse_uri(model_uri)
        objects = await self.downloader.retry(lambda: list_objects(self.client, bucket, prefix))
        names = {o.key[len(prefix):] for o in objects}
        if FUNCTION_MANIFEST in names:      # a function package: every file, in its folders
            return objects
        if "config.json" not in names:
            raise ColdStartFailed(f"missing object s3://{bucket}/{prefix}config.json")
        if not any(n.endswith(".safetensors") for n in names):
            raise ColdStartFailed(f"missing object s3://{bucket}/{prefix}model.safetensors")
        return [o for o in objects if not o.key.endswith(SKIP_SUFFIXES)]

    async def fetch_model(self, model_uri: str, objects: Optional[list[S3Object]] = None,
                          pins: Pins = NO_PINS) -> ModelFiles:
        """Every file of the model in the cache, linked into one folder; pins the entries.
        A `.gguf` object: the folder imported from it (one entry). `pins`: the objects
        as the revision was deployed with them; other bytes are a ColdStartFailed."""
        if is_gguf_uri(model_uri):
            return await self._fetch_gguf(model_uri, pins)
        started = time.monotonic()
        objects = objects if objects is not None else await self.list_model(model_uri, pins)
        keys = tuple(entry_key(o) for o in objects)
        self.cache.pin(keys)
        try:
            fetched = await settle_all([self._fetch(o) for o in objects])
            model_dir = self._link(objects, [path for path, _ in fetched], _package_prefix(model_uri, objects))
        except BaseException:
            self.cache.unpin(keys)
            raise
        downloaded = sum(n for _, n in fetched)
        return ModelFiles(model_dir, keys, downloaded, sum(o.size for o in objects) - downloaded,
                          time.monotonic() - started)

    async def cache_model(self, model_uri: str, pins: Pins = NO_PINS) -> CachedModel:
        """Every file of the model into the cache, the way fetch_model gets them (a
        download in flight for a cold start is joined, not repeated), but with no model
        folder made and nothing left pinned: evictable like any idle entry."""
        if is_gguf_uri(model_uri):
            files = await self._fetch_gguf(model_uri, pins)
            self.release(files)
            return CachedModel(files.keys, files.downloaded_bytes)
        objects = await self.list_model(model_uri, pins)
        keys = tuple(entry_key(o) for o in objects)
        self.cache.pin(keys)                # the first files stay while the rest download
        try:
            fetched = await settle_all([self._fetch(o) for o in objects])
        finally:
            self.cache.unpin(keys)
        return CachedModel(keys, sum(n for _, n in fetched))

    def release(self, files: ModelFiles) -> None:
        self.cache.unpin(files.keys)

    def _link(self, objects: list[S3Object], paths: list[Path], package_prefix: Optional[str] = None) -> Path:
        digest = hashlib.sha256("\n".join(entry_key(o) for o in objects).encode()).hexdigest()[:24]
        folder = self.cache.models / digest
        staging = self.cache.tmp / f"model-{digest}-{uuid.uuid4().hex}"
        staging.mkdir()
        for obj, path in zip(objects, paths):
            name = obj.key[len(package_prefix):] if package_prefix else obj.key.rsplit("/", 1)[-1]
            if ".." in Path(name).parts or name.startswith("/"):
                raise ColdStartFailed(f"{obj.uri}: a file name that leaves its folder")
            link = staging / name
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(path, link)
        shutil.rmtree(folder, ignore_errors=True)
        os.rename(staging, folder)
        return folder

    async def _fetch_gguf(self, model_uri: str, pins: Pins) -> ModelFiles:
        started = time.monotonic()
        (obj,) = await self.list_model(model_uri, pins)
        key = gguf.imported_key(obj)
        self.cache.pin([key])
        try:
            folder = await self.cache.lookup_folder(key)
            fresh = folder is None and obj not in self.cache
            if folder is None:
                folder = await self._once(key, lambda: self._import(obj, key))
        except BaseException:
            self.cache.unpin([key])
            raise
        downloaded = obj.size if fresh else 0
        return ModelFiles(folder, (key,), downloaded, obj.size - downloaded, time.monotonic() - started)

    async def _import(self, obj: S3Object, key: str) -> Path:
        """The object into the cache, then imported from there into an entry of its own."""
        raw = [entry_key(obj)]
        self.cache.pin(raw)                 # not evicted while it is read
        staging = self.cache.tmp / f"import-{uuid.uuid4().hex}"
        try:
            await gguf.run_import(await self.fetch_object(obj), staging, obj.uri)
            digests = await asyncio.to_thread(digests_of, staging)
            return self.cache.admit_folder(key, staging, {"bucket": obj.bucket, "key": obj.key,
                                                          "etag": obj.etag, "imported": "gguf"}, digests)
        finally:
            self.cache.unpin(raw)
            shutil.rmtree(staging, ignore_errors=True)

    async def fetch_object(self, obj: S3Object) -> Path:
        """The cached path of obj; concurrent callers share one download, which is
        cancelled when the last of them stops waiting."""
        return (await self._fetch(obj))[0]

    async def _fetch(self, obj: S3Object) -> tuple[Path, int]:
        """fetch_object, and the bytes it waited to download (0: a cache hit)."""
        hit = await self.cache.lookup(obj)
        if hit is not None:
            return hit, 0
        return await self._once(entry_key(obj), lambda: self._download_into_cache(obj)), obj.size

    async def _once(self, key: str, work: Callable[[], Awaitable[Path]]) -> Path:
        """work() run once for all concurrent callers of one key; cancelled when the
        last of them stops waiting."""
        if key not in self._inflight:
            task = asyncio.ensure_future(work())
            self._inflight[key] = Shared(task)
            task.add_done_callback(lambda _done: self._inflight.pop(key, None))
        shared = self._inflight[key]
        shared.waiters += 1
        try:
            return await asyncio.shield(shared.task)
        finally:
            shared.waiters -= 1
            if shared.waiters == 0 and not shared.task.done():
                shared.task.cancel()
                await asyncio.gather(shared.task, return_exceptions=True)

    async def _download_into_cache(self, obj: S3Object) -> Path:
        if obj.size > self.cache.budget_bytes:
            raise ColdStartFailed(f"{obj.uri} ({obj.size} bytes) exceeds the weight cache budget")
        self.cache.make_room(obj.size)
        temp = self.cache.temp_path()
        try:
            sha256 = await self.downloader.download(obj, temp)
            return self.cache.admit(obj, temp, sha256)
        finally:
            temp.unlink(missing_ok=True)

@dataclass
class Shared:
    task: asyncio.Task[Path]
    waiters: int = 0


async def settle_all(coros: Iterable[Awaitable[T]]) -> list[T]:
    """gather() that, on the first failure, cancels the rest and waits for them to end."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def pinned_under(model_uri: str, pins: Pins) -> Pins:
    """The pins of the objects under model_uri (of a revision's model, or of its draft)."""
    under = model_uri if is_gguf_uri(model_uri) else "s3://{}/{}".format(*parse_uri(model_uri))
    return {uri: pin for uri, pin in pins.items() if uri.startswith(under)}


def refuse_changed(model_uri: str, found: Pins, pins: Pins) -> None:
    """ColdStartFailed unless every object pinned under model_uri is found as pinned (the
    same ETag and size); objects added since are not the revision's and are left out."""
    for uri, pin in pinned_under(model_uri, pins).items():
        now = found.get(uri)
        if now is None and not uri.endswith(SKIP_SUFFIXES):
            raise ColdStartFailed(f"missing object {uri}: its revision was deployed with it")
        if now is not None and now != pin:
            raise ColdStartFailed(f"{uri} changed since its revision was deployed (ETag {now.etag}, "
                                  f"{now.size} bytes; deployed: ETag {pin.etag}, {pin.size} bytes): "
                                  "deploy a new revision to run it")


def _package_prefix(model_uri: str, objects: list[S3Object]) -> Optional[str]:
    """A function package's key prefix: its files keep their sub-folders (a model's
    folder is flat). None for a model."""
    if is_gguf_uri(model_uri):
        return None
    prefix = parse_uri(model_uri)[1]
    return prefix if any(o.key == prefix + FUNCTION_MANIFEST for o in objects) else None
