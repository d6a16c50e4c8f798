"""The Backend protocol: how the pool starts a runtime replica somewhere.

Two implementations: local processes (backends/local.py) and a Ray cluster
(backends/ray.py); `pool.backends.build_backend` picks one from the settings.
Every replica is a `runtime.server` reached over HTTP at base_url; the pool
itself waits for /health, so a backend only lists slots, starts and stops.
The protocol lists everything the manager calls, so both backends (and any
test double) implement all of it; where a method means nothing for a backend
(a node preference on one machine) it answers the neutral value.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional, Protocol, Sequence

from pool.api import RevisionSpec
from pool.inventory import Slot


class ReplicaHandle(Protocol):
    """One started replica, as its backend knows it."""
    replica_id: str
    base_url: str                                   # http://HOST:PORT of its runtime.server

    def is_alive(self) -> bool: ...

    def exit_reason(self) -> Optional[str]: ...     # why it died, once it has

    async def stop(self, timeout_s: float) -> None: ...


class Backend(Protocol):
    @property
    def pulls_on_node(self) -> bool:
        """True: each node fetches a revision's weights into its own cache, so
        start_replica gets no model_dir and the pool does not pull; nodes then
        differ in what they hold, which nodes_holding reports."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None:
        """Stop every replica and process this backend started."""
        ...

    async def inventory(self) -> list[Slot]:
        """The slots replicas may be placed on; re-read every desired_refresh_s
        (nodes of a cluster join and leave)."""
        ...

    async def nodes_holding(self, keys: Iterable[str]) -> set[str]:
        """Nodes whose own cache has every one of keys (pool.weights.entry_key):
        preferred for a cold start. Asked only when pulls_on_node."""
        ...

    async def start_replica(self, spec: RevisionSpec, slots: Sequence[Slot], model_dir: Optional[Path],
                            replica_id: str) -> ReplicaHandle:
        """Begin serving spec on slots; returns before the model is loaded.

        model_dir is the pool's local copy of the weights, or None when
        pulls_on_node (the chosen node fetches spec.model_uri itself).
        """
        ...

    def forget(self, handle: ReplicaHandle) -> None:
        """Drop a stopped replica from the backend's books (close() no longer stops it)."""
        ...
