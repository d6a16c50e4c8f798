"""How a replica's `python -m runtime.server` is started: engine kwargs, flags, environment.

Both backends start the same server; they differ in what the process sees
of the GPUs (`isolated`) and in where it runs.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from pool.api import RevisionSpec
from pool.inventory import Slot

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def engine_for(spec: RevisionSpec, slots: Sequence[Slot], kv_tokens_default: int, *,
               isolated: bool) -> dict[str, Any]:
    """The revision's engine kwargs plus what the slots imply: a KV budget when it
    gives none, the device, and tensor parallelism across more than one slot.

    isolated: the process sees only its slots' GPUs (Ray sets CUDA_VISIBLE_DEVICES
    for an actor), so "cuda" is its own device; otherwise one GPU is named by
    index, and several get "cuda" because the local backend then narrows
    CUDA_VISIBLE_DEVICES to them.
    """
    engine = dict(spec.engine)
    engine.setdefault("kv_cache_tokens", kv_tokens_default)
    cuda = [s for s in slots if s.kind == "cuda"]
    if cuda and "device" not in engine:
        own_index = len(cuda) == 1 and not isolated
        engine["device"] = f"cuda:{cuda[0].device_index}" if own_index else "cuda"
    if len(slots) > 1:
        engine.setdefault("tensor_parallel_size", len(slots))
    return engine


def engine_flags(engine: Mapping[str, Any]) -> list[str]:
    """runtime.LLM kwargs as `python -m runtime.server` flags."""
    flags: list[str] = []
    for name, value in engine.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{name.replace('_', '-')}")
        elif isinstance(value, (dict, list)):
            flags += [flag, json.dumps(value)]
        elif value is not None:
            flags += [flag, str(value)]
    return flags


def runtime_env(runtime_threads: Optional[int]) -> dict[str, str]:
    """What a runtime.server child needs on top of the environment it inherits: this
    checkout importable, and its thread count when the settings fix one (CPU replicas)."""
    path = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {"PYTHONPATH": path}
    if runtime_threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(runtime_threads)
    return env
