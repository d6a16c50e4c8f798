"""How a quantized checkpoint's tensors become the engine's weights, by config.json's
`quantization_config`.

A format says which stored float tensors keep their dtype as they load (`keep`: the
scales, runtime/load/stored_dtype.py) and turns the tensors read into weights (`gather`):
each quantized matmul's parts become one entry under its `.weight` name holding a
kernels.group_quant.GroupQuantized (or another kind of runtime/load/quantization.py), every
other tensor passes through. The model's loader then reads names as from a float
checkpoint.

- "gguf": a folder thawpool's GGUF importer wrote (runtime/gguf/importer.py): NAME.codes,
  NAME.scales, ... already in the layout, listed with their bits, group and super_every.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol

import torch

from kernels.group_quant import GroupQuantized, check

GROUP_PARTS = ("codes", "scales", "offsets", "scale_super", "offset_super")
FLOAT_PARTS = frozenset(GROUP_PARTS[1:])


class CheckpointFormat(Protocol):
    name: str

    def keep(self, name: str) -> bool: ...

    def gather(self, raw: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, Any]: ...


@dataclass(frozen=True)
class GgufFolder:
    weights: dict[str, dict[str, int]]        # .weight name -> bits, group, super_every
    name: str = "gguf"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "GgufFolder":
        weights = config.get("weights")
        if not isinstance(weights, dict):
            raise ValueError("quantization_config.weights: missing (a folder of thawpool's GGUF importer)")
        return cls(weights)

    def keep(self, name: str) -> bool:
        weight, _, part = name.rpartition(".")
        return part in FLOAT_PARTS and weight in self.weights

    def gather(self, raw: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, Any]:
        out: dict[str, Any] = dict(raw)
        for name, meta in self.weights.items():
            parts = {p: out.pop(f"{name}.{p}") for p in GROUP_PARTS if f"{name}.{p}" in out}
            if "codes" not in parts:
                raise ValueError(f"tensor {name}.codes: missing")
            weight = GroupQuantized(bits=int(meta["bits"]), group=int(meta["group"]),
                                    super_every=int(meta.get("super_every", 1)), **parts)
            try:
                check(weight)
            except ValueError as exc:
                raise ValueError(f"tensor {name}: {exc}") from None
            out[name] = weight
        return out


def checkpoint_format(quantization_config: Optional[dict[str, Any]]) -> Optional[CheckpointFormat]:
    """The format of a checkpoint whose config.json says `quantization_config` (None: floats)."""
    if not quantization_config:
        return None
    method = quantization_config.get("quant_method")
    if method == "gguf":
        return GgufFolder.from_config(quantization_config)
    raise ValueError(f"quantization_config.quant_method: {method!r} is not supported (gguf)")
