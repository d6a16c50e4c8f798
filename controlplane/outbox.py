"""A local durable outbox for usage events: JSON lines, appended and fsynced."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from controlplane.usage import UsageRecord

log = logging.getLogger("thawpool.outbox")


class Outbox:
    """Append-only file of events Postgres has not taken yet.

    Replaying is idempotent (rows are keyed by invocation id), so a crash
    between a replayed commit and clear() only replays again.
    """

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.depth = self._count()

    def _count(self) -> int:
        return len(self.read()) if self.path.exists() else 0

    def append(self, records: list[UsageRecord]) -> None:
        if not records:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(r.to_json() + "\n" for r in records).encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.depth += len(records)

    def read(self) -> list[UsageRecord]:
        """Every whole record; a torn last line (crash mid-append) is skipped."""
        if not self.path.exists():
            return []
        records = []
        for number, line in enumerate(self.path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(UsageRecord.from_json(line))
            except (ValueError, TypeError, KeyError) as exc:
                log.warning("outbox: skipping unreadable line",
                            extra={"line": number, "error": str(exc)})
        return records

    def clear(self) -> None:
        """Called only after every record read has been committed."""
        if self.path.exists():
            tmp = self.path.with_suffix(".tmp")
            tmp.write_bytes(b"")
            os.replace(tmp, self.path)
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        self.depth = 0
