"""How long a stored response is kept, and when the sweep goes on: pure decisions over
the time given (the caller reads the clock)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Retention:
    keep_s: float          # settings.response_retention_s
    batch: int = 1000      # rows one sweep statement deletes

    def cutoff(self, now: datetime) -> datetime:
        """Responses made at or before this are expired: unreadable, and swept."""
        return now - timedelta(seconds=self.keep_s)

    def sweep_again(self, deleted: int) -> bool:
        """A full batch may have left more behind; a short one swept them all."""
        return deleted >= self.batch
