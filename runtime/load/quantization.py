"""The kinds of weight a layer's matmul holds, and how many bytes the loaded weights take.

A matmul weight is a float tensor (packed for the kernels' linear), an `Int8Weight`
(quantization="int8", below), a `GroupQuantized` or `Fp8Weight` read from a quantized
checkpoint as it is (kernels/group_quant.py, kernels/fp8.py; runtime/load/checkpoint_formats.py),
or a `RowStack` of several of those along the output channels, for fused q/k/v or gate/up
whose parts a checkpoint stores in different formats. Every kind but the float tensor is a
dataclass of tensors with `tensors()` and `map(fn)`, so that moving, counting and caching
them needs no case per kind.

Weight-only int8 at load time:
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
from typing import Callable, Iterable, Optional, Sequence, Union

import torch

from kernels import group_quant
from kernels.fp8 import Fp8Weight
from kernels.group_quant import GroupQuantized
from kernels.int8 import quantize_per_channel

LINEAR_FIELDS = ("qkv", "o", "gate_up", "down")   # the LayerWeights fields that are matmuls


@dataclass(frozen=True)
class Int8Weight:
    qweight: torch.Tensor                  # [N, K] int8
    scale: torch.Tensor                    # [N] float32

    @property
    def nbytes(self) -> int:
        return _nbytes(self.qweight) + _nbytes(self.scale)

    def tensors(self) -> list[torch.Tensor]:
        return [self.qweight, self.scale]

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "Int8Weight":
        return Int8Weight(fn(self.qweight), fn(self.scale))


@dataclass(frozen=True)
class RowStack:
    """Weights whose outputs are concatenated, in order: one matmul of the model stored as
    parts that cannot be stacked into one weight."""
    parts: tuple["Weight", ...]

    def tensors(self) -> list[torch.Tensor]:
        return [t for part in self.parts for t in tensors_of(part)]

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "RowStack":
        return RowStack(tuple(map_weight(p, fn) for p in self.parts))


Quantized = Union[Int8Weight, GroupQuantized, Fp8Weight, RowStack]
Weight = Union[torch.Tensor, Quantized]


def tensors_of(value: Weight) -> list[torch.Tensor]:
    return [value] if isinstance(value, torch.Tensor) else value.tensors()


def map_weight(value: Weight, fn: Callable[[torch.Tensor], torch.Tensor]) -> Weight:
    return fn(value) if isinstance(value, torch.Tensor) else value.map(fn)


def stack_rows(parts: Sequence[Weight]) -> Weight:
    """The parts as one weight along the output channels (fused q/k/v, gate/up): one
    tensor or one quantized weight where their formats agree, else a RowStack of the
    runs of neighbours that do."""
    if all(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat(list(parts))                        # type: ignore[arg-type]
    if all(isinstance(p, Int8Weight) for p in parts):
        return Int8Weight(torch.cat([p.qweight for p in parts]),   # type: ignore[union-attr]
                          torch.cat([p.scale for p in parts]))     # type: ignore[union-attr]
    runs: list[Weight] = []                  # neighbours that stack are stacked (q and k, v apart)
    for part in parts:
        last = runs[-1] if runs else None
        if isinstance(last, GroupQuantized) and isinstance(part, GroupQuantized):
            stacked = group_quant.stack_rows([last, part])
            if stacked is not None:
                runs[-1] = stacked
                continue
        runs.append(part)
    return runs[0] if len(runs) == 1 else RowStack(tuple(runs))


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
    """x: [T, K] -> [T, N], whatever the kind of weight; ops is the dispatched
    kernels.dispatch.KernelSet."""
    if isinstance(weight, torch.Tensor):
        return ops.linear(x, weight, bias)
    if isinstance(weight, Int8Weight):
        return ops.int8_linear(x, weight.qweight, weight.scale, bias)
    if isinstance(weight, GroupQuantized):
        return ops.group_linear(x, weight, bias)
    if isinstance(weight, Fp8Weight):
        return ops.fp8_linear(x, weight, bias)
    out = torch.cat([linear(x, part, None, ops) for part in weight.parts], dim=-1)
    return out if bias is None else out + bias.to(out.dtype)


def pack_layer(layer, pack_linear):
    """A copy of a LayerWeights whose float matmul weights went through pack_linear (a
    checkpoint's quantized ones are kept as they are)."""
    return dataclasses.replace(layer, **{f: pack_linear(getattr(layer, f)) for f in _linear_fields(layer)
                                         if isinstance(getattr(layer, f), torch.Tensor)})


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
    tensors = tensors_of(value)
    fresh = [t for t in tensors if _identity(t) not in seen]
    seen.update(_identity(t) for t in fresh)
    return sum(_nbytes(t) for t in fresh)


def _identity(t: torch.Tensor) -> int:
    # a packed (opaque oneDNN) weight has no data pointer, and is never shared
    return id(t) if t.is_mkldnn else t.data_ptr()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
