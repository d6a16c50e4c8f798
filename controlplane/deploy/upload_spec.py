"""Upload bodies and part plans, pure: what a tenant may upload and how it is cut.

A tenant uploads a model folder `name` of files (relative paths and sizes) to
its own prefix, `s3://<models bucket>/tenants/<tenant id>/<name>/`. Each file becomes one
S3 multipart upload of `part_size` parts (the last one shorter), at most
10,000 parts, as S3 allows. The completion names, per file, each part's ETag.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from controlplane.fields import MAX_BIGINT, integer, obj, text
from controlplane.store.errors import InvalidField

UPLOAD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
PATH_SEGMENT = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$")
MAX_FILES = 256
MAX_DEPTH = 4
MAX_PARTS = 10_000
MIN_PART_BYTES = 5 * 1024 ** 2


@dataclass(frozen=True)
class FileSpec:
    path: str
    size: int


@dataclass(frozen=True)
class UploadSpec:
    name: str
    files: tuple[FileSpec, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class PartPlan:
    part_size: int
    part_count: int

    def size_of(self, part_number: int, file_size: int) -> int:
        """Every part is `part_size` bytes but the last, which holds the rest."""
        if part_number < self.part_count:
            return self.part_size
        return file_size - self.part_size * (self.part_count - 1)


def parse_upload(body: Any, max_file_bytes: int) -> UploadSpec:
    body = obj("body", body, {"name", "files"})
    name = body.get("name")
    if not isinstance(name, str) or not UPLOAD_NAME.match(name):
        raise InvalidField("name", "letters, digits, '.', '_' and '-', 1-128 characters")
    raw_files = body.get("files")
    if not isinstance(raw_files, list) or not 1 <= len(raw_files) <= MAX_FILES:
        raise InvalidField("files", f"a list of 1 to {MAX_FILES} files")
    files = tuple(_file(f"files[{i}]", item, max_file_bytes) for i, item in enumerate(raw_files))
    paths = [f.path for f in files]
    if len(set(paths)) != len(paths):
        raise InvalidField("files", "each path at most once")
    return UploadSpec(name, files)


def _file(field: str, value: Any, max_file_bytes: int) -> FileSpec:
    value = obj(field, value, {"path", "size"})
    path = text(f"{field}.path", value.get("path"), max_length=512)
    segments = path.split("/")
    if len(segments) > MAX_DEPTH or not all(PATH_SEGMENT.match(s) for s in segments):
        raise InvalidField(f"{field}.path", f"a relative path of at most {MAX_DEPTH} plain "
                                            "names (letters, digits, '.', '_', '-')")
    size = integer(f"{field}.size", value.get("size"), minimum=1, maximum=MAX_BIGINT)
    if size > max_file_bytes:
        raise InvalidField(f"{field}.size", f"larger than the {max_file_bytes} bytes a file "
                                            "may have")
    return FileSpec(path, size)


def plan_parts(size: int, part_bytes: int) -> PartPlan:
    """Parts of `part_bytes` (at least S3's 5 MiB), larger when 10,000 would not hold it."""
    part_size = max(part_bytes, MIN_PART_BYTES, math.ceil(size / MAX_PARTS))
    return PartPlan(part_size, max(1, math.ceil(size / part_size)))


def parse_completion(body: Any) -> dict[str, list[tuple[int, str]]]:
    """{"files": [{"path", "parts": [{"part_number", "etag"}]}]} -> {path: [(n, etag)]}."""
    body = obj("body", body, {"files"})
    raw_files = body.get("files")
    if not isinstance(raw_files, list) or not 1 <= len(raw_files) <= MAX_FILES:
        raise InvalidField("files", f"a list of 1 to {MAX_FILES} files")
    completed: dict[str, list[tuple[int, str]]] = {}
    for i, item in enumerate(raw_files):
        item = obj(f"files[{i}]", item, {"path", "parts"})
        path = text(f"files[{i}].path", item.get("path"), max_length=512)
        parts = item.get("parts")
        if not isinstance(parts, list) or not 1 <= len(parts) <= MAX_PARTS:
            raise InvalidField(f"files[{i}].parts", f"a list of 1 to {MAX_PARTS} parts")
        completed[path] = [_part(f"files[{i}].parts[{j}]", p) for j, p in enumerate(parts)]
    return completed


def _part(field: str, value: Any) -> tuple[int, str]:
    value = obj(field, value, {"part_number", "etag"})
    number = integer(f"{field}.part_number", value.get("part_number"), minimum=1,
                     maximum=MAX_PARTS)
    return number, text(f"{field}.etag", value.get("etag"), max_length=128).strip('"')
