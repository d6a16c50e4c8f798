"""The node's weight cache: objects/<key>/{data,meta.json}, one entry per S3 object
(named by where its bytes came from and their ETag), least recently used evicted past the
disk budget, entries in use pinned. A hit is used only while its bytes are those written:
the SHA-256 hashed with the download is kept, and a hit whose files' stat differs from
when they were last verified is hashed again (pool/weights/store.py fills the cache).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from pool.s3 import S3Object, origin_prefix

log = logging.getLogger(__name__)

HASH_READ_BYTES = 4 * 1024 * 1024


def entry_key(obj: S3Object) -> str:
    """Named by where the bytes came from and their ETag; the platform's objects
    (origin "") keep the names they had before tenants could bring their own bucket."""
    name = origin_prefix(obj) + f"{obj.bucket}/{obj.key}/{obj.etag}"
    return hashlib.sha256(name.encode()).hexdigest()[:40]


class WeightCache:
    """objects/<key>/{data,meta.json}; LRU order kept in memory, rebuilt from mtimes."""

    def __init__(self, root: Path, budget_bytes: int):
        self.root = Path(root)
        self.budget_bytes = budget_bytes
        self.objects = self.root / "objects"
        self.tmp = self.root / "tmp"
        self.models = self.root / "models"
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)   # tenants' weights: ours alone
        for d in (self.objects, self.tmp, self.models):
            d.mkdir(parents=True, exist_ok=True)
        self._clear_tmp()
        self._lru: OrderedDict[str, int] = OrderedDict()    # key -> size, oldest first
        self._pins: dict[str, int] = {}
        self._digests: dict[str, Digests] = {}              # key -> its files' SHA-256, when written
        self._verified: dict[str, Fingerprint] = {}         # key -> its files' stat when last hashed
        self._scan()

    def _clear_tmp(self) -> None:
        for leftover in self.tmp.iterdir():
            shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink(missing_ok=True)

    def _scan(self) -> None:
        found = []
        for entry in self.objects.iterdir():
            meta = entry / "meta.json"
            if (entry / "data").exists() and meta.is_file():         # a file, or an imported folder
                found.append((meta.stat().st_mtime, entry.name, json.loads(meta.read_text())))
            else:
                shutil.rmtree(entry, ignore_errors=True)
        for _, key, meta in sorted(found):
            self._lru[key] = meta["size"]
            # entries written before their digests were kept are fetched (imported) again
            if "sha256" in meta:
                self._digests[key] = {"": meta["sha256"]}
            elif "files" in meta:
                self._digests[key] = dict(meta["files"])

    @property
    def used_bytes(self) -> int:
        return sum(self._lru.values())

    async def lookup(self, obj: S3Object) -> Optional[Path]:
        """The entry's data while its bytes are those downloaded; an entry whose bytes
        changed is evicted (None: fetch it again)."""
        key = entry_key(obj)
        data = self.objects / key / "data"
        if key not in self._lru or not data.is_file():
            return None
        if not await self._intact(key, data, obj.size):
            log.warning("weight cache entry of %s changed on disk: evicted", obj.uri)
            self._evict(key)
            return None
        self._lru.move_to_end(key)
        os.utime(self.objects / key / "meta.json")
        return data

    async def _intact(self, key: str, data: Path, size: Optional[int]) -> bool:
        """The same files with the same stat as when last verified, or else the same
        SHA-256 each as when the entry was written."""
        recorded, seen = self._digests.get(key), fingerprint(data)
        if recorded is None or set(seen) != set(recorded):
            return False
        if size is not None and seen[""].size != size:
            return False
        if self._verified.get(key) == seen:
            return True
        if await asyncio.to_thread(digests_of, data) != recorded:
            return False
        self._verified[key] = seen
        return True

    def _evict(self, key: str) -> None:
        self._lru.pop(key, None)
        self._digests.pop(key, None)
        self._verified.pop(key, None)
        shutil.rmtree(self.objects / key, ignore_errors=True)

    async def lookup_folder(self, key: str) -> Optional[Path]:
        """An imported model folder held under `key` (pool/weights/gguf.py) while its files are
        those imported, or None (one that changed is evicted)."""
        data = self.objects / key / "data"
        if key not in self._lru or not data.is_dir():
            return None
        if not await self._intact(key, data, None):
            log.warning("weight cache entry %s (an imported folder) changed on disk: evicted", key)
            self._evict(key)
            return None
        self._lru.move_to_end(key)
        os.utime(self.objects / key / "meta.json")
        return data

    def admit_folder(self, key: str, folder: Path, meta: dict[str, str], digests: Digests) -> Path:
        """Move a finished folder (under tmp/), whose files hash to digests, into the
        cache as entry `key`; its files read-only."""
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        self.make_room(size)
        staging = self.tmp / f"{key}.{uuid.uuid4().hex}"
        staging.mkdir()
        for f in folder.rglob("*"):
            if f.is_file():
                os.chmod(f, 0o444)
        os.rename(folder, staging / "data")
        (staging / "meta.json").write_text(json.dumps({**meta, "size": size, "files": digests}))
        try:
            os.rename(staging, self.objects / key)
        except OSError:                      # another import got there first
            shutil.rmtree(staging, ignore_errors=True)
            return self.objects / key / "data"      # its files are checked at their next lookup
        self._record(key, size, digests)
        return self.objects / key / "data"

    def _record(self, key: str, size: int, digests: Digests) -> None:
        self._lru[key] = size
        self._lru.move_to_end(key)
        self._digests[key] = digests
        self._verified[key] = fingerprint(self.objects / key / "data")

    def temp_path(self) -> Path:
        return self.tmp / f"{uuid.uuid4().hex}.part"

    def admit(self, obj: S3Object, temp: Path, sha256: str) -> Path:
        """Move a verified temp file, whose bytes hash to sha256, into the cache (atomic
        directory rename); read-only, as every replica reads it through its links."""
        key = entry_key(obj)
        staging = self.tmp / f"{key}.{uuid.uuid4().hex}"
        staging.mkdir()
        os.chmod(temp, 0o444)
        os.rename(temp, staging / "data")
        (staging / "meta.json").write_text(json.dumps(
            {"bucket": obj.bucket, "key": obj.key, "etag": obj.etag, "size": obj.size, "sha256": sha256}))
        final = self.objects / key
        try:
            os.rename(staging, final)
        except OSError:                      # another download got there first
            shutil.rmtree(staging, ignore_errors=True)
            return final / "data"            # its bytes are checked at their next lookup
        self._record(key, obj.size, {"": sha256})
        return final / "data"

    def make_room(self, nbytes: int) -> list[str]:
        """Evict unpinned entries, oldest first, until nbytes more fit the budget."""
        evicted = []
        for key in list(self._lru):
            if self.used_bytes + nbytes <= self.budget_bytes:
                break
            if self._pins.get(key):
                continue
            self._evict(key)
            evicted.append(key)
        if self.used_bytes + nbytes > self.budget_bytes:
            log.warning("weight cache over budget: %d in use by live replicas", self.used_bytes)
        return evicted

    def pin(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._pins[key] = self._pins.get(key, 0) + 1

    def unpin(self, keys: Iterable[str]) -> None:
        for key in keys:
            left = self._pins.get(key, 0) - 1
            if left > 0:
                self._pins[key] = left
            else:
                self._pins.pop(key, None)

    def __contains__(self, obj: S3Object) -> bool:
        return entry_key(obj) in self._lru

    def holds(self, keys: Iterable[str]) -> bool:
        """Every entry is in the cache now (a read, not a use: LRU order unchanged)."""
        return all(key in self._lru for key in keys)


@dataclass(frozen=True)
class Signature:
    """What a file's stat says of its bytes. Not ctime: a sandboxed model replica's hard
    links to an entry (pool/model_sandbox.py) change it at every placement, and a changed
    signature costs a full re-hash. An entry's files are root's and read-only (0444) in a
    folder of root's alone, so writing one takes a chmod first, which the mode shows; a
    writer able to put back mode, owner and mtime is root, whom no stat can catch."""
    inode: int
    size: int
    mtime_ns: int
    mode: int
    owner: int


# An entry's files by path within it ("": the entry's data is one file)
Digests = dict[str, str]                # -> SHA-256
Fingerprint = dict[str, Signature]      # -> stat


def signature(path: Path) -> Signature:
    st = path.stat()
    return Signature(st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode, st.st_uid)


def fingerprint(data: Path) -> Fingerprint:
    if data.is_file():
        return {"": signature(data)}
    return {str(f.relative_to(data)): signature(f) for f in sorted(data.rglob("*")) if f.is_file()}


def digests_of(data: Path) -> Digests:
    return {rel: sha256_of(data / rel if rel else data) for rel in fingerprint(data)}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_READ_BYTES):
            h.update(chunk)
    return h.hexdigest()
