"""The local durable outbox for usage events Postgres has not taken yet, the dead-letter
file for those it never will, and the journal of events still in memory.

Each record is one line framed with its length and checksum,
`<length> <crc32, 8 hex> <JSON>\\n`, appended with one write and fsynced. A crash
mid-append leaves a torn last line (no newline yet): it is cut off when the outbox
is opened and before any later append, so the next record never glues onto it.
A whole line whose length or checksum is wrong (a disk that lost a page) is handed
to the caller as corrupt, not replayed. Lines of plain JSON, as written before the
framing, are still read.

Replay reads from an offset in batches (`read_batch`) and then drops what it wrote
(`drop_before`), keeping whatever was appended meanwhile; it is idempotent (usage
rows are keyed by invocation id), so a crash between a commit and the drop only
replays again. One lock serializes the file: appends come from the writer's thread
and from `UsageWriter.submit` when it spills its buffer.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO, Iterator, Optional

from controlplane.billing.usage import UsageRecord

log = logging.getLogger("thawpool.outbox")

FRAME = re.compile(rb"(\d+) ([0-9a-f]{8}) (.*)", re.DOTALL)
READ_CHUNK = 1 << 20


def frame(payload: bytes) -> bytes:
    return b"%d %08x %s\n" % (len(payload), zlib.crc32(payload), payload)


def unframe(line: bytes) -> Optional[bytes]:
    """The payload of one line (without its newline), or None when the line is corrupt."""
    if line.startswith(b"{"):                  # written before records were framed
        return line
    match = FRAME.fullmatch(line)
    if match is None:
        return None
    payload = match.group(3)
    if int(match.group(1)) != len(payload) or int(match.group(2), 16) != zlib.crc32(payload):
        return None
    return payload


@dataclass
class Batch:
    """What `read_batch` found from an offset on."""
    records: list[UsageRecord] = field(default_factory=list)
    corrupt: list[bytes] = field(default_factory=list)     # whole lines that failed their check
    end: int = 0                                           # the offset after the last line read


class Outbox:
    """Append-only file of usage events; `depth` counts its lines."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._end = 0              # bytes of whole lines; anything after is a torn tail
        self.depth = 0
        with self._lock:
            self._repair()

    def append(self, records: list[UsageRecord]) -> None:
        if not records:
            return
        data = b"".join(frame(r.to_json().encode()) for r in records)
        with self._lock:
            self._repair()
            _append(self.path, data)
            self._end += len(data)
            self.depth += len(records)

    def read_batch(self, offset: int, size: int) -> Batch:
        """Up to `size` records from `offset` (a line boundary) on, and corrupt lines met."""
        batch = Batch(end=offset)
        with self._lock, _open_or_none(self.path) as f:
            if f is None:
                return batch
            f.seek(offset)
            while len(batch.records) < size and batch.end < self._end:
                line = f.readline(self._end - batch.end)
                batch.end += len(line)
                _parse_into(batch, line.rstrip(b"\n"))
        return batch

    def drop_before(self, offset: int) -> None:
        """Forget the lines before `offset` (replayed), keeping those appended since."""
        if offset <= 0:
            return
        with self._lock:
            if not self.path.exists():
                return
            with open(self.path, "rb") as f:
                f.seek(offset)
                tail = f.read(max(0, self._end - offset))
            _replace(self.path, tail)
            self._end, self.depth = len(tail), tail.count(b"\n")

    def read(self) -> list[UsageRecord]:
        """Every whole record (tests and tools; replay reads in batches)."""
        return self.read_batch(0, 1 << 62).records

    def _repair(self) -> None:
        """Cut a torn tail (bytes after the last newline) off the file, and count lines."""
        size = self.path.stat().st_size if self.path.exists() else 0
        if size == self._end:
            return
        self._end, self.depth = _whole_lines(self.path, size)
        if self._end < size:
            log.warning("outbox: cut a torn last record (a crash mid-append)",
                        extra={"path": str(self.path), "bytes": size - self._end})
            with open(self.path, "r+b") as f:
                f.truncate(self._end)
                os.fsync(f.fileno())


class Journal:
    """Each usage event as it is submitted, written (not fsynced) to a segment file: a
    process killed with events still in memory (SIGKILL, the OOM killer) loses none, since
    the kernel keeps what was written; the next start moves them into the outbox. The
    writer seals the current segment when it starts draining memory and forgets sealed
    segments once every event in them is committed or in the outbox."""

    PATTERN = "usage-journal-*.log"

    def __init__(self, directory: Path | str):
        self.directory = Path(directory)
        self._fd: Optional[int] = None
        self._open: Optional[Path] = None
        self._sealed: list[Path] = []

    def append(self, record: UsageRecord) -> None:
        """Never raises: a journal that cannot be written leaves the event in memory only."""
        try:
            if self._fd is None:
                self._open, self._fd = open_segment(self.directory, self.PATTERN)
            os.write(self._fd, frame(record.to_json().encode()))
        except OSError as exc:
            log.warning("usage journal not written: a killed process would lose this event",
                        extra={"error": repr(exc)[:300]})

    def seal(self) -> list[Path]:
        """Close the segment being written; every segment closed and not yet forgotten."""
        if self._fd is not None and self._open is not None:
            os.close(self._fd)
            self._sealed.append(self._open)
            self._fd = self._open = None
        return list(self._sealed)

    def forget(self, segments: list[Path]) -> None:
        for segment in segments:
            segment.unlink(missing_ok=True)
            self._sealed.remove(segment)

    def leftovers(self) -> list[Path]:
        """Segments an earlier process left (not this one's)."""
        return leftover_segments(self.directory, self.PATTERN, {self._open, *self._sealed})

    @staticmethod
    def read(segments: list[Path]) -> Batch:
        batch = Batch()
        for segment in segments:
            for line in segment.read_bytes().split(b"\n"):   # a torn last line is corrupt
                _parse_into(batch, line)
        return batch


class DeadLetters:
    """Usage events (or, in a file of their own, replica events) Postgres refused for
    good, each with why, for an operator to look at: framed lines like the outbox's,
    fsynced, never replayed."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self._lock = threading.Lock()

    def add(self, records: list[UsageRecord], error: str) -> None:
        self._write([{"record": json.loads(r.to_json())} for r in records], error)

    def add_corrupt(self, lines: list[bytes], error: str) -> None:
        self._write([{"line": line.decode("utf-8", "replace")} for line in lines], error)

    def add_entries(self, entries: list[dict[str, object]], error: str) -> None:
        """Anything else refused for good (replica events: controlplane.billing.refusals), as JSON."""
        self._write(entries, error)

    def read(self) -> list[dict[str, object]]:
        if not self.path.exists():
            return []
        payloads = [unframe(line) for line in self.path.read_bytes().split(b"\n") if line]
        return [json.loads(p) for p in payloads if p is not None]

    def _write(self, entries: list[dict[str, object]], error: str) -> None:
        at = datetime.now(timezone.utc).isoformat()
        data = b"".join(frame(json.dumps({"at": at, "error": error, **entry},
                                         separators=(",", ":")).encode()) for entry in entries)
        with self._lock:
            _append(self.path, data)


def open_segment(directory: Path, pattern: str) -> tuple[Path, int]:
    """A new journal segment named by `pattern` (its `*` a timestamp), open for appends."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / pattern.replace("*", str(time.time_ns()))
    return path, os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)


def leftover_segments(directory: Path, pattern: str, own: set[Optional[Path]]) -> list[Path]:
    """Segments matching `pattern` an earlier process left, oldest first."""
    return sorted(p for p in directory.glob(pattern) if p not in own)


def _parse_into(batch: Batch, line: bytes) -> None:
    if not line.strip():
        return
    payload = unframe(line)
    try:
        if payload is None:
            raise ValueError("length or checksum does not match")
        batch.records.append(UsageRecord.from_json(payload.decode()))
    except (ValueError, TypeError, KeyError):
        batch.corrupt.append(line)


def _whole_lines(path: Path, size: int) -> tuple[int, int]:
    """(bytes up to and including the last newline, number of lines) of the file."""
    end, lines, read = 0, 0, 0
    with _open_or_none(path) as f:
        while f is not None and read < size:
            chunk = f.read(min(READ_CHUNK, size - read))
            if not chunk:
                break
            last = chunk.rfind(b"\n")
            if last >= 0:
                end = read + last + 1
            lines += chunk.count(b"\n")
            read += len(chunk)
    return end, lines


@contextlib.contextmanager
def _open_or_none(path: Path) -> Iterator[Optional[BinaryIO]]:
    """The file for reading, or None when there is none yet."""
    if not path.exists():
        yield None
        return
    with open(path, "rb") as f:
        yield f


def _append(path: Path, data: bytes) -> None:
    """One write, then fsync: the data is on disk when this returns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_synced(path, data, os.O_APPEND)


def _replace(path: Path, data: bytes) -> None:
    """`path` holds `data`, atomically and durably (a crash leaves the old file or the new)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    _write_synced(tmp, data, os.O_TRUNC)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _write_synced(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | mode, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
