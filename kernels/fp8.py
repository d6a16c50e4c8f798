"""FP8 weights (e4m3) with a float32 scale per tensor or per output channel, pure torch.

A weight `w: [N, K]` is `weight: [N, K] float8_e4m3fn` and `scale: [] or [N] float32`
with w = weight * scale (per channel: scale[n] for row n), as FP8 checkpoints store
them (quant_method "fp8", compressed-tensors' float-quantized). Where the GPU multiplies
FP8 natively (`native`: compute capability 8.9 and up) the engine runs them as they are,
`fp8_linear`: the activations quantized to e4m3 per token as vLLM does
(`quantize_per_token`) and both multiplied by torch._scaled_mm; elsewhere they are
widened at load (`widen`), to bf16 on the CPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max                 # 448
# vLLM's floor on a token's scale: a row of zeros quantizes to zeros, not to 0 / 0
MIN_TOKEN_SCALE = 1.0 / (E4M3_MAX * 512.0)
FP8_CAPABILITY = (8, 9)         # Ada and Hopper on: e4m3 matmuls
ROWWISE_CAPABILITY = (9, 0)     # where _scaled_mm takes a scale per row of each operand


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


def native(device: torch.device | str) -> bool:
    """Whether `device` multiplies FP8 (fp8_linear runs there): a CUDA GPU of compute
    capability 8.9 or more. Asks no GPU that is not there."""
    device = torch.device(device)
    if device.type != "cuda" or torch.version.cuda is None or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= FP8_CAPABILITY


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M, K], float32 scale [M, 1]) with x ~ q * scale: each row's
    largest magnitude lands on 448 (vLLM's dynamic per-token quantization, its
    reciprocal-multiply and floor included)."""
    amax = x.abs().amax(dim=-1, keepdim=True).float()
    scale = (amax / E4M3_MAX).clamp(min=MIN_TOKEN_SCALE)
    q = (x.float() * (1.0 / scale)).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, scale


def fp8_linear(x: torch.Tensor, w: Fp8Weight, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [..., K] -> [..., N] in x's dtype: e4m3 activations (quantize_per_token) times the
    e4m3 weight on the FP8 tensor cores, sums in fp32, both scales applied to the sum.
    On CUDA, K and N are multiples of 16 (torch._scaled_mm's; every checkpoint's are)."""
    n, k = w.shape
    if x.shape[-1] != k:
        raise ValueError(f"fp8_linear: x has {x.shape[-1]} features, the weight expects {k}")
    if x.device.type == "cuda" and (k % 16 or n % 16):
        raise ValueError(f"fp8_linear: [{n}, {k}] weight; FP8 matmuls need N and K multiples of 16")
    q, x_scale = quantize_per_token(x.reshape(-1, k))
    w_scale = w.scale.float().expand(n).reshape(1, n).contiguous()
    weight_t = w.weight.t()                      # column-major [K, N], as _scaled_mm wants it
    if x.dtype == torch.bfloat16 and rowwise(x.device):
        out = torch._scaled_mm(q, weight_t, scale_a=x_scale, scale_b=w_scale, out_dtype=torch.bfloat16,
                               bias=None if bias is None else bias.to(torch.bfloat16))
    else:
        # one scale per operand (unit ones) is what every FP8 GPU's _scaled_mm takes, in
        # any output dtype: the fp32 sum is scaled here
        one = torch.ones((), dtype=torch.float32, device=x.device)
        out = torch._scaled_mm(q, weight_t, scale_a=one, scale_b=one, out_dtype=torch.float32)
        out = out * x_scale * w_scale
        if bias is not None:
            out = out + bias.float()
        out = out.to(x.dtype)
    return out.reshape(*x.shape[:-1], n)


def rowwise(device: torch.device) -> bool:
    """Whether _scaled_mm applies the per-row scales itself (bf16 out): on the CPU and on
    Hopper and later; Ada takes the unit-scale path."""
    if device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device) >= ROWWISE_CAPABILITY
