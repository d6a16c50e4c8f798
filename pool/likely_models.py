"""Which model folders a warm standby is told it will likely load (wire/replica_control.py's
LikelyModels), so it parses their tokenizers before the load asks (runtime/serve/
parsed_tokenizers.py): a pure decision over what the node loaded, no I/O, no clock.

A folder is known only for a model this node loaded before (the weight cache's folder of
symlinks, pool/weights/store.py, whose path stays the same for the same objects). First
the revisions predicted to be called soon (pool/prefetcher.py's `predicted`, most likely
first) whose folders are known, then the folders loaded most recently: a model served
once is likely to be served again after it scaled to zero. A wrong guess costs the
standby a background parse and the load nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from wire.replica_control import MAX_LIKELY_MODELS

REMEMBERED_LOADS = 32        # revisions whose folder the node remembers


@dataclass(frozen=True)
class ModelLoad:
    """A model this node loaded: its revision, and its folder as a standby sees it."""
    revision_id: str
    folder: str


def remember(loads: tuple[ModelLoad, ...], load: ModelLoad,
             keep: int = REMEMBERED_LOADS) -> tuple[ModelLoad, ...]:
    """`loads` (newest first) with `load` the newest: one per revision, at most `keep`."""
    return ((load,) + tuple(old for old in loads if old.revision_id != load.revision_id))[:keep]


def likely_models(predicted: Sequence[str], loads: tuple[ModelLoad, ...],
                  limit: int = MAX_LIKELY_MODELS) -> tuple[str, ...]:
    """The folders of the predicted revisions that were loaded here (in their order), then
    the most recently loaded folders; each once, at most `limit`."""
    folder_of = {load.revision_id: load.folder for load in reversed(loads)}   # the newest wins
    ranked = [folder_of[r] for r in predicted if r in folder_of] + [load.folder for load in loads]
    return tuple(dict.fromkeys(ranked))[:limit]
