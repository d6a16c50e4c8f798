"""pool.backends.base.ReplicaHandle of a replica that is up at `base_url`, started by a
test or benchmark rather than by a backend: always alive, nothing to stop."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional


@dataclass
class LiveHandle:
    replica_id: str
    base_url: str
    adapter_inbox: Optional[Path] = None
    env_s: float = 0.0
    headers: Mapping[str, str] = field(default_factory=dict)

    def is_alive(self) -> bool:
        return True

    def exit_reason(self) -> Optional[str]:
        return None

    async def stop(self, timeout_s: float) -> None:
        return None
