"""How the engine runs a model: its options as one typed object with one validation.

A tenant sets the options in TENANT_OPTIONS at deploy (the control plane parses the
deployment's `engine` object with `parse` and answers a refusal with a 422 naming
`engine.<option>`); the pool adds what the placement decides (the device, a KV budget,
tensor parallelism, the node's packed layers) and starts `python -m runtime.serve.server`
with them as flags (`to_flags`); the server reads the flags back (`add_flags`,
`from_flags`) and the engine runs the model with them (runtime/core/config.py's
EngineConfig is these options and the model folder). Every refusal is an `InvalidOption`
whose message starts with the option's name.
"""
from __future__ import annotations

import argparse
import json
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from typing import AbstractSet, Any, Callable, Optional

DTYPES = ("float32", "bfloat16", "float16")
QUANTIZATIONS = (None, "int8")              # int8: weight-only, runtime/load/quantization.py
KV_CACHE_DTYPES = ("auto", "bfloat16")
TASKS = ("generate", "embed")
POOLINGS = ("last", "mean")
# the order a replica serves requests in (runtime/engine/serve_order.py): by arrival, or
# by the call's `priority` (wire/priority.py) then arrival, as vLLM's --scheduling-policy
SCHEDULING_POLICIES = ("fcfs", "priority")
POSITIVE = ("kv_cache_tokens", "block_size", "max_num_seqs", "max_num_batched_tokens",
            "max_model_len", "tensor_parallel_size", "max_lora_rank")


class InvalidOption(ValueError):
    """An option the engine cannot run with: `option` names it, `reason` says why."""

    def __init__(self, option: str, reason: str):
        super().__init__(f"{option}: {reason}")
        self.option = option
        self.reason = reason


@dataclass(frozen=True)
class EngineOptions:
    device: str = "cpu"
    dtype: str = "float32"
    kv_cache_tokens: Optional[int] = None        # None: sized from a memory budget
    kv_cache_memory_fraction: float = 0.5        # of free device memory (CPU: of available RAM)
    kv_cache_max_bytes_cpu: int = 4 << 30        # sane cap on the CPU
    enable_prefix_caching: bool = True
    cache_salt: Optional[str] = None             # e.g. a revision id; changes every block hash
    speculative: Optional[dict[str, Any]] = None  # runtime/spec_decode/speculator.py parses it
    quantization: Optional[str] = None
    tensor_parallel_size: int = 1
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: Optional[int] = None          # None: the model's max_position_embeddings
    seed: int = 0
    task: str = "generate"                       # or "embed": pooled hidden states (runtime/engine/pooling.py)
    pooling: str = "last"                        # embed: "last" token or "mean" over the prompt
    kv_cache_dtype: str = "auto"                 # "auto": the model's dtype; "bfloat16": half the bytes
    batch_invariant: bool = False                # a request's logprobs the same bits in any batch (CPU)
    packed_cache_dir: Optional[str] = None       # CPU: the node's packed layers (runtime/load/packed_weights.py)
    packed_cache_gb: float = 16.0                # ... and its size, least recently used evicted
    cuda_graphs: bool = False                    # decode steps replayed as CUDA graphs (runtime/engine/cuda_graphs.py)
    cpu_low_precision: bool = False              # bf16 / W8A8 GEMMs where the CPU has them (kernels/cpu/features.py)
    cpu_replay: bool = True                      # CPU decode steps replayed (runtime/engine/cpu_replay.py)
    max_loras: int = 0                           # LoRA adapter slots (runtime/lora/); 0: no adapters
    max_lora_rank: int = 16                      # the highest adapter rank the slots hold
    # "priority": interactive calls before batch ones; requests of one priority are
    # served exactly as "fcfs" serves them, so it is the default
    scheduling_policy: str = "priority"

    def validate(self) -> None:
        """InvalidOption for the first option of the wrong type or value, or that the others
        rule out."""
        for name, kind in KINDS.items():
            _check_kind(name, getattr(self, name), kind)
        for name, allowed in (("dtype", DTYPES), ("quantization", QUANTIZATIONS), ("task", TASKS),
                              ("pooling", POOLINGS), ("kv_cache_dtype", KV_CACHE_DTYPES),
                              ("scheduling_policy", SCHEDULING_POLICIES)):
            if getattr(self, name) not in allowed:
                raise InvalidOption(name, f"{getattr(self, name)!r} is not one of "
                                          f"{', '.join(map(repr, allowed))}")
        for name in POSITIVE:
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise InvalidOption(name, "must be a positive integer")
        self._check_combinations()

    def _check_combinations(self) -> None:
        if self.task == "embed" and self.speculative is not None:
            raise InvalidOption("speculative", "an embedding model generates nothing to speculate on")
        if self.cuda_graphs and not (self.device.startswith("cuda") and self.tensor_parallel_size == 1):
            raise InvalidOption("cuda_graphs", "decode graphs need a CUDA device and one rank "
                                f"(device {self.device!r}, tensor_parallel_size {self.tensor_parallel_size})")
        if self.max_loras < 0:
            raise InvalidOption("max_loras", "must be 0 (no adapters) or more")
        if self.max_loras and self.speculative is not None:
            raise InvalidOption("max_loras", "adapters do not run with speculative decoding yet")
        if self.max_loras and self.tensor_parallel_size > 1:
            raise InvalidOption("max_loras", "adapters run on one rank for now "
                                f"(tensor_parallel_size {self.tensor_parallel_size})")
        if self.batch_invariant and not self.device.startswith("cpu"):
            raise InvalidOption("batch_invariant", "the batch-invariant kernels are the CPU's; "
                                                   f"device {self.device!r} has none yet")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < self.block_size:
            raise InvalidOption("kv_cache_tokens", f"must be at least block_size ({self.block_size})")


def _kind(hint: Any) -> tuple[type, bool]:
    """An option's type with Optional taken off (str, int, float, bool or dict), and
    whether None is one of its values."""
    optional = typing.get_origin(hint) is typing.Union
    base = next(a for a in typing.get_args(hint) if a is not type(None)) if optional else hint
    return typing.get_origin(base) or base, optional


KINDS = {name: _kind(hint) for name, hint in typing.get_type_hints(EngineOptions).items()}
OPTIONS = frozenset(KINDS)
# what a tenant may set at deploy; the rest are the pool's (the device, the KV budget's
# memory fraction and CPU cap, the packed layers, the cache salt) or the operator's (CUDA graphs,
# CPU replays)
TENANT_OPTIONS = frozenset({"dtype", "kv_cache_tokens", "enable_prefix_caching", "speculative",
                            "quantization", "tensor_parallel_size", "max_num_seqs",
                            "max_num_batched_tokens", "max_model_len", "block_size", "seed",
                            "task", "pooling", "kv_cache_dtype", "batch_invariant", "cpu_low_precision",
                            "max_loras", "max_lora_rank", "scheduling_policy"})
_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
               dict: "a JSON object"}


def _check_kind(name: str, value: Any, kind: tuple[type, bool]) -> None:
    base, optional = kind
    if value is None and optional:
        return
    numeric = base is float and isinstance(value, int)
    if isinstance(value, bool) != (base is bool) or not (isinstance(value, base) or numeric):
        raise InvalidOption(name, f"must be {_TYPE_NAMES[base]}")


def parse(values: Mapping[str, Any], allowed: AbstractSet[str] = OPTIONS) -> EngineOptions:
    """The options `values` sets, the defaults for the rest; a None value is not set.
    InvalidOption names an option outside `allowed` or the first wrong one."""
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise InvalidOption(unknown[0], "unknown engine option")
    options = EngineOptions(**{name: value for name, value in values.items() if value is not None})
    options.validate()
    return options


class ChosenOptions(Mapping[str, Any]):
    """The options a deployment chose, and the pool then adds to, by name; one left out
    keeps the engine's default (so the pool can tell "not set" from "set to the default":
    the device, the KV budget, tensor parallelism). Read-only and compared by value: a
    revision's spec holds one. Names are checked here; values when the engine is built
    (`options`), since a value the deploy checked may only be judged with the rest."""

    __slots__ = ("_values",)

    def __init__(self, values: Optional[Mapping[str, Any]] = None):
        chosen = {name: value for name, value in (values or {}).items() if value is not None}
        unknown = sorted(set(chosen) - OPTIONS)
        if unknown:
            raise InvalidOption(unknown[0], "unknown engine option")
        self._values = chosen

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"ChosenOptions({self._values!r})"

    def with_(self, **changes: Any) -> ChosenOptions:
        """A copy with `changes` chosen (None: back to the engine's default)."""
        return ChosenOptions({**self._values, **changes})

    def with_defaults(self, **defaults: Any) -> ChosenOptions:
        """A copy where each of `defaults` is chosen unless it already is."""
        return ChosenOptions({**defaults, **self._values})

    def options(self) -> EngineOptions:
        """Every option, validated (InvalidOption names the first wrong one)."""
        return parse(self._values)

    def to_json(self) -> dict[str, Any]:
        return dict(self._values)


# ---------------------------------------------------------------- as flags

def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def to_flags(values: Mapping[str, Any]) -> list[str]:
    """Options as `python -m runtime.serve.server` flags: --x VALUE, a switch as --x or
    --no-x, a JSON object as its text; None is left out (the engine's default)."""
    flags: list[str] = []
    for name, value in values.items():
        if isinstance(value, bool):
            flags.append(flag(name) if value else flag("no_" + name))
        elif isinstance(value, dict):
            flags += [flag(name), json.dumps(value)]
        elif value is not None:
            flags += [flag(name), str(value)]
    return flags


_FROM_TEXT: dict[type, Callable[[str], Any]] = {str: str, int: int, float: float, dict: json.loads}


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per option; one left unset keeps the engine's default (from_flags)."""
    for name, (base, _) in KINDS.items():
        if base is bool:
            parser.add_argument(flag(name), dest=name, action=argparse.BooleanOptionalAction, default=None)
        else:
            parser.add_argument(flag(name), dest=name, type=_FROM_TEXT[base], default=None)


def from_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The options the command line set (add_flags)."""
    return {name: getattr(args, name) for name in KINDS if getattr(args, name) is not None}


def option_values(options: EngineOptions) -> dict[str, Any]:
    """Every option by name (a shallow copy: `speculative` is the same dict)."""
    return {f.name: getattr(options, f.name) for f in fields(options)}
