"""`thawpool models push`: a model folder (or one GGUF file) through presigned multipart
uploads, parts in parallel, each checked against its MD5, resumable.

The control plane hands out one presigned URL per part (controlplane/deploy/uploads.py); the
CLI PUTs each part there, compares S3's ETag with the part's own MD5 (a part that
arrived damaged is sent again), and completes the upload with the ETags, which the
control plane checks against S3 once more. Progress and the part URLs live in a state
file (0600, in the user's cache dir) written after every part, so a push that was
killed continues where it stopped when the same command runs again: only the parts
not yet recorded are sent.
"""
from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import httpx

from controlplane.cli.client import JSON, Client, ApiRefused, Unreachable
from controlplane.cli.profiles import write_private

PART_ATTEMPTS = 3


@dataclass(frozen=True)
class LocalFile:
    path: str          # relative, with '/', as the upload names it
    source: Path
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class Part:
    file: LocalFile
    number: int
    offset: int
    size: int
    url: str


def files_of(source: Path) -> list[LocalFile]:
    """A folder's files (hidden ones left out), or the one file given."""
    if source.is_file():
        return [_local(source.name, source)]
    found = sorted(p for p in source.rglob("*") if p.is_file()
                   and not any(s.startswith(".") for s in p.relative_to(source).parts))
    return [_local(p.relative_to(source).as_posix(), p) for p in found]


def _local(path: str, source: Path) -> LocalFile:
    stat = source.stat()
    return LocalFile(path, source, stat.st_size, stat.st_mtime_ns)


class PushState:
    """What a push has done so far, in a file of its own (it holds presigned URLs)."""

    def __init__(self, path: Path, data: JSON):
        self.path, self.data = path, data
        self.lock = threading.Lock()

    @classmethod
    def load(cls, path: Path) -> Optional["PushState"]:
        try:
            return cls(path, json.loads(path.read_text()))
        except (OSError, ValueError):
            return None

    def matches(self, url: str, files: list[LocalFile]) -> bool:
        """Same server and the same bytes on disk (sizes and modification times)."""
        return (self.data.get("url") == url and
                self.data.get("files") == {f.path: [f.size, f.mtime_ns] for f in files})

    def done(self, path: str) -> dict[str, str]:
        return dict(self.data["done"].get(path, {}))

    def record(self, path: str, number: int, etag: str) -> None:
        with self.lock:
            self.data["done"].setdefault(path, {})[str(number)] = etag
            self.save()

    def save(self) -> None:
        write_private(self.path, json.dumps(self.data))

    def forget(self) -> None:
        self.path.unlink(missing_ok=True)


def new_state(path: Path, url: str, files: list[LocalFile], upload: JSON) -> PushState:
    state = PushState(path, {
        "url": url, "upload_id": upload["id"], "model_uri": upload["model_uri"],
        "files": {f.path: [f.size, f.mtime_ns] for f in files},
        "plans": {f["path"]: {"part_size": f["part_size"],
                              "urls": [p["url"] for p in f["parts"]]} for f in upload["files"]},
        "done": {}})
    state.save()
    return state


def parts_left(state: PushState, files: list[LocalFile]) -> list[Part]:
    left = []
    for file in files:
        plan, done = state.data["plans"][file.path], state.done(file.path)
        for number, url in enumerate(plan["urls"], 1):
            if str(number) not in done:
                offset = (number - 1) * plan["part_size"]
                left.append(Part(file, number, offset,
                                 min(plan["part_size"], file.size - offset), url))
    return left


class PartSender:
    """PUTs parts to their presigned URLs, each checked against its MD5."""

    def __init__(self, state: PushState, on_part: Callable[[Part], None]):
        self.state, self.on_part = state, on_part
        self.http = httpx.Client(timeout=httpx.Timeout(300.0, connect=10.0))

    def send_all(self, parts: list[Part], parallel: int) -> None:
        with self.http, ThreadPoolExecutor(max(1, parallel)) as threads:
            for done in [threads.submit(self.send, part) for part in parts]:
                done.result()          # the first failure stops the push (state is kept)

    def send(self, part: Part) -> None:
        with part.file.source.open("rb") as handle:
            handle.seek(part.offset)
            data = handle.read(part.size)
        md5 = hashlib.md5(data).hexdigest()
        for attempt in range(1, PART_ATTEMPTS + 1):
            etag = self._put(part, data, last=attempt == PART_ATTEMPTS)
            if etag == md5:
                self.state.record(part.file.path, part.number, etag)
                self.on_part(part)
                return
        raise Unreachable(f"{part.file.path} part {part.number}: S3's checksum never matched "
                          "the part's MD5")

    def _put(self, part: Part, data: bytes, *, last: bool) -> Optional[str]:
        """S3's ETag of the stored part; None when this attempt failed and may be retried."""
        try:
            response = self.http.put(part.url, content=data)
        except httpx.HTTPError as exc:
            if last:
                raise Unreachable(f"{part.file.path} part {part.number}: {type(exc).__name__}; "
                                  "run the same command again to resume") from None
            return None
        if response.status_code == 403:
            raise ApiRefused(403, "the upload's part URLs expired; push again with --restart",
                          code="upload_urls_expired")
        if response.status_code >= 400:
            if last:
                raise ApiRefused(response.status_code, f"S3 refused {part.file.path} part "
                              f"{part.number}: {response.text[:200]}")
            return None
        return str(response.headers.get("etag", "")).strip('"')


def completion(state: PushState, files: list[LocalFile]) -> list[JSON]:
    return [{"path": f.path, "parts": [{"part_number": int(n), "etag": etag}
                                       for n, etag in sorted(state.done(f.path).items(),
                                                             key=lambda item: int(item[0]))]}
            for f in files]


def pending_upload(client: Client, state: PushState) -> Optional[JSON]:
    """The server's view of the saved upload, when it can still be resumed."""
    try:
        upload = client.upload(state.data["upload_id"])
    except ApiRefused as exc:
        if exc.status == 404:
            return None
        raise
    return upload if upload["status"] in ("pending", "complete") else None


def state_path(cache: Path, url: str, name: str, source: Path) -> Path:
    key = hashlib.sha256(f"{url}\n{name}\n{source.resolve()}".encode()).hexdigest()[:24]
    return cache / "pushes" / f"{key}.json"

