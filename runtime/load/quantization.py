"""Weight-only int8 at load time, and how many bytes the loaded weights take.

`quantization="int8"` replaces the decoder's linear weights (fused q/k/v, o,
fused gate/up, down) by an `Int8Weight`: symmetric int8 per output channel plus
an fp32 scale, made by kernels.int8 from the checkpoint's floats. Embeddings,
norms, biases and the lm head keep the engine dtype: the lm head is the
embedding itself on tied models, its rounding errors go straight into every
logit, and the pool's size estimate (pool/weights/inspection.py counts only
`*_proj.weight` as int8-able) assumes the same split.

Fusing before quantizing is exact: the scale is per output row, and q, k and v
(or gate and up) are stacked along rows.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Optional, Union

import torch

from kernels.int8 import quantize_per_channel

LINEAR_FIELDS = ("qkv", "o", "gate_up", "down")   # the LayerWeights fields that are matmuls


@dataclass(frozen=True)
class Int8Weight:
    qweight: torch.Tensor                  # [N, K] int8
    scale: torch.Tensor                    # [N] float32

    @property
    def nbytes(self) -> int:
        return _nbytes(self.qweight) + _nbytes(self.scale)


Weight = Union[torch.Tensor, Int8Weight]


@dataclass(frozen=True)
class WeightMemory:
    """Bytes of the loaded weights on the device, each tensor counted once."""
    total_bytes: int
    linear_bytes: int                      # the LINEAR_FIELDS of every layer


def quantize_weight(weight: torch.Tensor, device: str) -> Int8Weight:
    """weight: [N, K] float (any device) -> Int8Weight on `device`."""
    qweight, scale = quantize_per_channel(weight.to(device))
    return Int8Weight(qweight, scale)


def quantize_layer(layer, device: str):
    """A copy of a LayerWeights whose matmul weights are int8 on `device`."""
    return dataclasses.replace(layer, **{f: quantize_weight(getattr(layer, f), device)
                                         for f in _linear_fields(layer)})


def linear(x: torch.Tensor, weight: Weight, bias: Optional[torch.Tensor], ops) -> torch.Tensor:
    """x: [T, K] -> [T, N], float (packed by ops.pack_linear) or int8 weight alike;
    ops is the dispatched kernels.dispatch.KernelSet."""
    if isinstance(weight, Int8Weight):
        return ops.int8_linear(x, weight.qweight, weight.scale, bias)
    return ops.linear(x, weight, bias)


def pack_layer(layer, pack_linear):
    """A copy of a float LayerWeights whose matmul weights went through pack_linear."""
    return dataclasses.replace(layer, **{f: pack_linear(getattr(layer, f)) for f in _linear_fields(layer)})


def _linear_fields(layer) -> list[str]:
    """The layer's matmuls (a layer with experts has no dense gate_up and down)."""
    return [f for f in LINEAR_FIELDS if getattr(layer, f) is not None]


def weight_memory(layers: Iterable, others: Iterable[Optional[torch.Tensor]]) -> WeightMemory:
    """layers: LayerWeights; others: embedding, final norm, lm head (tied ones count once)."""
    seen: set[int] = set()
    linear_bytes = total = 0
    for layer in layers:
        for f in dataclasses.fields(layer):
            n = _count(getattr(layer, f.name), seen)
            total += n
            linear_bytes += n if f.name in LINEAR_FIELDS else 0
    total += sum(_count(t, seen) for t in others)
    return WeightMemory(total_bytes=total, linear_bytes=linear_bytes)


def _count(value, seen: set[int]) -> int:
    if value is None:
        return 0
    tensors = (value.qweight, value.scale) if isinstance(value, Int8Weight) else (value,)
    fresh = [t for t in tensors if _identity(t) not in seen]
    seen.update(_identity(t) for t in fresh)
    return sum(_nbytes(t) for t in fresh)


def _identity(t: torch.Tensor) -> int:
    # a packed (opaque oneDNN) weight has no data pointer, and is never shared
    return id(t) if t.is_mkldnn else t.data_ptr()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
