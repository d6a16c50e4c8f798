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
- "awq", "gptq", "compressed-tensors", "fp8": Hugging Face quantized folders, read by
  spec/quantization_config.py and repacked by runtime/load/hf_quantized.py. FP8 weights stay
  FP8 where the device multiplies FP8 (kernels/fp8.py:native) and are widened to the
  engine's dtype elsewhere (the CPU's linear then packs them as it packs any float weight).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol

import torch

from kernels import fp8
from kernels.group_quant import PARTS, GroupQuantized, check
from runtime.load import hf_quantized
from spec.quantization_config import QuantizationScheme, keeps_dtype, scheme

FLOAT_PARTS = frozenset(PARTS[1:])


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
            parts = {p: out.pop(f"{name}.{p}") for p in PARTS if f"{name}.{p}" in out}
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


@dataclass(frozen=True)
class HfFolder:
    scheme: QuantizationScheme

    @property
    def name(self) -> str:
        return self.scheme.method

    def keep(self, name: str) -> bool:
        return keeps_dtype(self.scheme, name)

    def gather(self, raw: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, Any]:
        return {name: _widened_unless_native(value, dtype)
                for name, value in hf_quantized.gather(raw, self.scheme, dtype).items()}


def _widened_unless_native(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, fp8.Fp8Weight) and not fp8.native(value.weight.device):
        return fp8.widen(value, dtype)
    return value


def checkpoint_format(quantization_config: Optional[dict[str, Any]]) -> Optional[CheckpointFormat]:
    """The format of a checkpoint whose config.json says `quantization_config` (None:
    floats); ValueError naming the field it cannot serve."""
    if not quantization_config:
        return None
    if quantization_config.get("quant_method") == "gguf":
        return GgufFolder.from_config(quantization_config)
    found = scheme({"quantization_config": quantization_config})
    assert found is not None
    return HfFolder(found)
