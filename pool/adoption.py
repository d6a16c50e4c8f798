"""Re-adoption: what a pool remembers of each replica it starts, and what the next pool
decides about the ones it finds still registered after a control-plane crash.

A replica outlives the pool that started it (local processes run in their own
sessions; Ray actors are detached and named). Its backend keeps a
`ReplicaRecord` where the next pool finds it (local: a 0600 file in the state
dir; Ray: the actor itself). At start, before taking requests, the manager
asks the backend for these survivors and `decide`s about each one, a pure
decision:

  forget  its process is gone: nothing to do (its lifetime is closed by the
          first heartbeat, which does not list it)
  stop    alive but not wanted: its revision is no longer deployed or has
          another spec, its slots are gone, or it does not answer with its
          secret as a ready replica of its revision
  adopt   alive, wanted and answering: ready again on the same slots

`spec_fingerprint` is what "the same spec" means: what the replica runs and
holds (model, engine, memory, GPUs), not how its revision scales.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, Collection, Mapping, Optional, Sequence

from pool.api import RevisionSpec
from pool.replica import Replica, ReplicaState, Transition

ADOPTED = "adopted after a control-plane restart"


@dataclass(frozen=True)
class ReplicaRecord:
    """What the next pool needs to find, trust and account for a replica."""
    replica_id: str
    revision_id: str
    deployment_id: str
    tenant_id: str
    fingerprint: str                   # spec_fingerprint of the spec it was started for
    node: str
    slot_ids: tuple[str, ...]
    bytes_per_slot: Optional[int]      # what placement reserved; None: unknown (its whole slots)
    base_url: str
    started_at: datetime               # UTC
    secret: str = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "slot_ids": list(self.slot_ids), "started_at": self.started_at.isoformat()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReplicaRecord:
        """ValueError for a record that is not one (missing fields, wrong types)."""
        try:
            values = {**data, "slot_ids": tuple(data["slot_ids"]),
                      "started_at": datetime.fromisoformat(data["started_at"])}
            return cls(**values)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a replica record: {exc}") from None


def spec_fingerprint(spec: RevisionSpec) -> str:
    """Equal for two specs whose replicas are interchangeable (same model, engine and size)."""
    what = {"model_uri": spec.model_uri, "engine": spec.engine.to_json(), "gpu_memory_gb": spec.gpu_memory_gb,
            "gpu_count": spec.gpu_count}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Registration:
    """What the pool adds to a replica's record as it starts it: the fingerprint of the
    revision's spec (before a draft model's URI is replaced by its local folder) and what
    placement reserved per slot."""
    fingerprint: str
    bytes_per_slot: Optional[int] = None


def record_for(spec: RevisionSpec, node: str, slot_ids: Sequence[str], replica_id: str, *, base_url: str,
               secret: str, registration: Optional[Registration], started_at: datetime) -> ReplicaRecord:
    """The record of a replica a backend just started (registration None: spec as given)."""
    given = registration or Registration(spec_fingerprint(spec))
    return ReplicaRecord(replica_id, spec.revision_id, spec.deployment_id, spec.tenant_id, given.fingerprint,
                         node, tuple(slot_ids), given.bytes_per_slot, base_url, started_at, secret)


class Verdict(str, Enum):
    ADOPT = "adopt"
    STOP = "stop"
    FORGET = "forget"


def decide(record: ReplicaRecord, *, alive: bool, answers: bool, wanted: Optional[RevisionSpec],
           slot_ids: Collection[str]) -> tuple[Verdict, str]:
    """What to do with a survivor, and why. wanted: its revision's spec in the desired
    state (None: not deployed); slot_ids: the slots the pool has now."""
    if not alive:
        return Verdict.FORGET, "its process is gone"
    if wanted is None:
        return Verdict.STOP, f"revision {record.revision_id} is no longer deployed"
    if spec_fingerprint(wanted) != record.fingerprint:
        return Verdict.STOP, f"revision {record.revision_id} now has another spec"
    missing = [sid for sid in record.slot_ids if sid not in slot_ids]
    if missing or not record.slot_ids:
        return Verdict.STOP, f"its slot(s) {', '.join(missing) or '(none)'} are not in the pool"
    if not answers:
        return Verdict.STOP, "it does not answer with its secret as a ready replica of its revision"
    return Verdict.ADOPT, ADOPTED


def adopted_replica(record: ReplicaRecord, mono: float, at: datetime) -> Replica:
    """The lifecycle record of an adopted replica: ready since `at`, on its slots."""
    return Replica(record.replica_id, record.revision_id, mono, record.started_at, slot_ids=record.slot_ids,
                   reason=ADOPTED, history=[Transition(ReplicaState.READY, mono, at, ADOPTED)])
