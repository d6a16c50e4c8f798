"""What a replica's `python -m runtime.serve.server` is given: engine kwargs, flags, environment.

The cold start builds one launch from these for both backends (pool/launch.py);
the engine differs only by what the process sees of the GPUs (`isolated`).

Every runtime process gets its own random secret in its environment
(wire/replica_secret.py: SECRET_ENV), never on its command line, and
refuses every call but /health that does not carry `auth_headers(secret)`.
A process serves one replica in its life (a warm standby too: it is taken
once, and stopped if its load fails), so no two replicas share a secret.

A speculative draft model is named by URI (`engine.speculative.model`) like
the model itself; `draft_model_uri` refuses anything else, and the runtime is
given the folder the weights were pulled into (`with_draft_folder`).
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from pool.api import ModelUnavailable, RevisionSpec
from pool.inventory import Slot
from wire.replica_secret import SECRET_ENV
from pool.s3 import parse_uri
from spec.engine_options import ChosenOptions, to_flags

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def auth_headers(secret: str) -> dict[str, str]:
    """What every call to the replica carries."""
    return {"Authorization": f"Bearer {secret}"}


def engine_for(spec: RevisionSpec, slots: Sequence[Slot], kv_tokens_default: int, *,
               isolated: bool, packed: Optional[tuple[Path, float]] = None) -> ChosenOptions:
    """The revision's engine kwargs plus what the slots imply: a KV budget when it
    gives none, the device, and tensor parallelism across more than one slot.

    isolated: the process sees only its slots' GPUs (Ray sets CUDA_VISIBLE_DEVICES
    for an actor), so "cuda" is its own device; otherwise one GPU is named by
    index, and several get "cuda" because the local backend then narrows
    CUDA_VISIBLE_DEVICES to them. packed: the node's packed-layer cache (folder, GB) for
    CPU replicas.
    """
    engine = spec.engine.with_defaults(kv_cache_tokens=kv_tokens_default)
    cuda = [s for s in slots if s.kind == "cuda"]
    if cuda:
        own_index = len(cuda) == 1 and not isolated
        engine = engine.with_defaults(device=f"cuda:{cuda[0].device_index}" if own_index else "cuda")
    if len(slots) > 1:
        engine = engine.with_defaults(tensor_parallel_size=len(slots))
    if packed is not None and not cuda and packed[1] > 0:
        # the node's packed layers: a CPU replica of a model packed here before maps them
        engine = engine.with_(packed_cache_dir=str(packed[0]), packed_cache_gb=packed[1])
    return engine


def engine_flags(engine: Mapping[str, Any]) -> list[str]:
    """The revision's engine options as `python -m runtime.serve.server` flags, spelled by
    spec/engine_options.py (the server parses them with the same module)."""
    return to_flags(engine)


def runtime_env(runtime_threads: Optional[int], secret: Optional[str] = None) -> dict[str, str]:
    """What a runtime.serve.server child needs on top of the environment it inherits: its
    secret (None: added where each process is started, `ReplicaLaunch.environment`), this
    checkout importable, and its thread count when the settings fix one (CPU replicas)."""
    path = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {"PYTHONPATH": path, **({SECRET_ENV: secret} if secret is not None else {})}
    if runtime_threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(runtime_threads)
    return env


def draft_model_uri(engine: Mapping[str, Any]) -> Optional[str]:
    """The URI of the speculative draft model, None without one; ModelUnavailable when
    `model` is not an s3:// URI (a path on the node is never taken from a tenant)."""
    speculative = engine.get("speculative")
    if not isinstance(speculative, Mapping) or speculative.get("method") != "draft":
        return None
    model = speculative.get("model")
    if not isinstance(model, str) or not _is_model_uri(model):
        raise ModelUnavailable(f"engine.speculative.model: the draft model must be a model URI "
                               f"(s3://bucket/prefix/), not {model!r}")
    return model


def _is_model_uri(value: str) -> bool:
    try:
        parse_uri(value)
    except ValueError:
        return False
    return True


def with_draft_folder(engine: ChosenOptions, folder: str) -> ChosenOptions:
    """The engine options with the draft model's local folder in place of its URI."""
    return engine.with_(speculative={**engine["speculative"], "model": folder})
