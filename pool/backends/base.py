"""The Backend protocol: how the pool starts a runtime replica somewhere.

Two implementations: local processes (backends/local.py) and a Ray cluster
(backends/ray.py); `pool.backends.build_backend` picks one from the settings.
Every replica is a `runtime.server` reached over HTTP at base_url; the pool
itself waits for /health, so a backend only starts and stops.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Protocol, Sequence

from pool.api import RevisionSpec
from pool.inventory import Slot


class ReplicaHandle(Protocol):
    replica_id: str
    base_url: str

    def is_alive(self) -> bool: ...

    def exit_reason(self) -> Optional[str]: ...      # why it died, once it has

    async def stop(self, timeout_s: float) -> None: ...


class Backend(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def start_replica(self, spec: RevisionSpec, slots: Sequence[Slot], model_dir: Optional[Path],
                            replica_id: str) -> ReplicaHandle:
        """Begin serving spec from model_dir on slots; returns before the model is loaded.

        model_dir is None only for a backend with `pulls_on_node = True`, which fetches
        spec.model_uri into the chosen node's own cache. Such a backend may also offer
        `inventory()` (slots across nodes) and `nodes_holding(cache_keys)` (nodes whose
        cache has those pool.weights.entry_key entries), both optional.
        """
        ...
