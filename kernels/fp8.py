"""FP8 weights (e4m3) with a float32 scale per tensor or per output channel, pure torch.

A weight `w: [N, K]` is `weight: [N, K] float8_e4m3fn` and `scale: [] or [N] float32`
with w = weight * scale (per channel: scale[n] for row n), as FP8 checkpoints store
them (quant_method "fp8", compressed-tensors' float-quantized). Where the GPU multiplies
FP8 natively the engine runs them as they are; elsewhere they are widened at load
(`widen`), to bf16 on the CPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

E4M3 = torch.float8_e4m3fn


@dataclass(frozen=True)
class Fp8Weight:
    weight: torch.Tensor            # [N, K] float8_e4m3fn
    scale: torch.Tensor             # [] (per tensor) or [N] (per channel) float32

    @property
    def shape(self) -> tuple[int, int]:
        n, k = self.weight.shape
        return n, k

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def tensors(self) -> list[torch.Tensor]:
        return [self.weight, self.scale]

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "Fp8Weight":
        return Fp8Weight(fn(self.weight), fn(self.scale))


def dequantize(w: Fp8Weight) -> torch.Tensor:
    """[N, K] float32: weight * scale."""
    scale = w.scale.float()
    return w.weight.float() * (scale[:, None] if scale.dim() == 1 else scale)


def widen(w: Fp8Weight, dtype: torch.dtype) -> torch.Tensor:
    """The dense weight in `dtype` (where no FP8 matmul runs)."""
    return dequantize(w).to(dtype)


def linear_ref(x: torch.Tensor, w: Fp8Weight, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The definition: x @ dequantize(w).T in float32 (+ bias), cast to x's dtype."""
    out = x.float() @ dequantize(w).T
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)
