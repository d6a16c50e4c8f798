"""The Backend protocol: where the pool starts a runtime replica.

Two implementations: local processes (backends/local.py) and a Ray cluster
(backends/ray.py); `pool.backends.build_backend` picks one from the settings.
What a replica's process is (its server, interpreter, arguments, environment,
sandbox) the cold start decides once, as a `ReplicaLaunch` (pool/launch.py); a
backend decides where it runs (which node, which GPUs, a warm standby or a fresh
process) and fills in only what that node knows (its address, its copy of the
weights, its interpreter). Every replica is reached over HTTP at base_url; the pool
itself waits for /health, so a backend only lists slots, starts and stops.
The protocol lists everything the manager calls, so both backends (and any
test double) implement all of it; where a method means nothing for a backend
(a node preference on one machine) it answers the neutral value.

Replicas outlive the pool that started them (re-adoption, pool/adoption.py):
each backend keeps a `ReplicaRecord` of every replica it starts where the next
pool finds it, and `survivors()` hands the next pool what it found.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Optional, Protocol, Sequence

from pool.adoption import Registration, ReplicaRecord
from pool.api import RevisionSpec
from pool.inventory import Slot

if TYPE_CHECKING:
    # pool.launch imports this package's runtime_args, whose package imports this module first
    from pool.launch import ReplicaLaunch


class ReplicaHandle(Protocol):
    """One started replica, as its backend knows it."""
    replica_id: str
    base_url: str                                   # http://HOST:PORT of its runtime.serve.server
    env_s: float                                    # a function's venv built by start_replica on its node
                                                    # (0: none, or the pool built it before)
    adapter_inbox: Optional[Path]                   # the pool's path of its adapter inbox, a folder bound
                                                    # read-only into its sandbox (pool/adapter_inbox.py);
                                                    # None: none here, adapters go as PUT bodies

    @property
    def headers(self) -> Mapping[str, str]: ...     # every call carries them: the replica's secret

    def is_alive(self) -> bool: ...

    def exit_reason(self) -> Optional[str]: ...     # why it died, once it has

    async def stop(self, timeout_s: float) -> None: ...


@dataclass(frozen=True)
class Survivor:
    """A replica an earlier pool started and registered: its record, and a handle on it
    when its process is still alive (the backend then has it on its books, like one it
    started), else None (its registration is already dropped)."""
    record: ReplicaRecord
    handle: Optional[ReplicaHandle]


class Backend(Protocol):
    @property
    def pulls_on_node(self) -> bool:
        """True: each node fetches a revision's weights into its own cache, so
        start_replica gets no model_dir and the pool does not pull; nodes then
        differ in what they hold, which nodes_holding reports."""
        ...

    @property
    def isolates_gpus(self) -> bool:
        """True: a replica's process sees only its own GPUs (Ray sets CUDA_VISIBLE_DEVICES for
        an actor), so its engine's device is plain "cuda"; False: it may see the node's
        every GPU, and one GPU is named by index."""
        ...

    @property
    def can_sleep(self) -> bool:
        """True: a sleeping replica (pool/sleep_tier.py) frees its GPUs for the pool to
        place others on; False: the backend holds a replica's GPUs for its whole life (a
        Ray actor's num_gpus), so idle replicas are stopped instead of sleeping."""
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
        """Nodes whose own cache has every one of keys (pool.weights.cache.entry_key):
        preferred for a cold start. Asked only when pulls_on_node."""
        ...

    async def start_replica(self, spec: RevisionSpec, launch: ReplicaLaunch, slots: Sequence[Slot],
                            replica_id: str, *, registration: Optional[Registration] = None) -> ReplicaHandle:
        """Start launch's process for spec's revision on slots; returns before it is loaded.

        launch.folder is the pool's local copy of the weights, or None when
        pulls_on_node (the chosen node fetches spec.model_uri itself, pinned to
        spec.pins, and a speculative draft model's URI too). The runtime process
        has a secret of its own and answers only calls that carry the handle's
        headers. The replica is registered (its ReplicaRecord, with what
        `registration` adds; None: the fingerprint of spec) until forget().
        """
        ...

    async def survivors(self) -> list[Survivor]:
        """The replicas an earlier pool registered here and never stopped (asked once,
        right after start()): local, the state dir's records; Ray, the named actors of
        the pool's namespace. Leftovers that serve no replica (warm standbys) are
        stopped on the way."""
        ...

    def expect(self, revision_ids: Sequence[str]) -> None:
        """The revisions a call is predicted for soon, most likely first (pool/prefetcher.py),
        told at every reconcile: a backend with warm standbys tells them the models they
        will likely load (pool/likely_models.py); one without ignores it."""
        ...

    def forget(self, handle: ReplicaHandle) -> None:
        """Drop a stopped replica from the backend's books and its registration (close()
        no longer stops it, the next pool does not look for it)."""
        ...
