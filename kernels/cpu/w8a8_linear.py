"""W8A8 on the CPU: int8 weights times int8 activations quantized per token at run time.

w8a8_linear has the signature of kernels/int8.py:int8_linear and computes its W8A8
definition, int8.w8a8_linear_ref: x's few outlier channels are set apart in fp32
(kernels/int8.py says why), the rest is quantized per token (scale_t = max|x_t| / 127),
torch._int_mm multiplies int8 by int8 into exact int32 sums (oneDNN's gemm_s8s8s32,
which uses the VNNI dot-product instructions where the CPU has them), and the per-token
and per-channel scales are applied to the [T, N] result. The int8 weight is the one
quantization="int8" already stores ([N, K], read transposed in place: no copy).

RowSplit is what kernels/dispatch.py puts in KernelSet.int8_linear when the CPU has int8
dot products: W8A8 from min_rows rows of x up, the weight-only kernel below
(kernels/cpu/features.py says why). Without them oneDNN's int8 GEMM runs on plain AVX2,
about 20x slower than the fp32 GEMM of the same shape here, so only a forced plan
(tests, benchmarks/lowp_quality.py) runs it on such a CPU.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from kernels import int8


def available() -> bool:
    return hasattr(torch, "_int_mm")


def w8a8_linear(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                bias: Optional[torch.Tensor] = None, outliers: int = int8.W8A8_OUTLIERS) -> torch.Tensor:
    """x: [..., K], qweight: [N, K] int8, scale: [N], bias: [N] -> [..., N] in x's dtype."""
    n, k = qweight.shape
    inliers, outlying, cols = int8.split_outliers(x.reshape(-1, k), outliers)
    xq, xscale = int8.quantize_per_token(inliers)
    acc = torch._int_mm(xq, qweight.t())                      # [T, N] int32, exact
    out = torch.mul(acc, xscale[:, None])                     # int32 * fp32 -> fp32 in one pass
    out.addmm_(outlying, qweight[:, cols].T.float())          # the outlier channels, fp32 x int8 weights
    out.mul_(scale.float())
    if bias is not None:
        out += bias.float()
    return out.to(x.dtype).reshape(*x.shape[:-1], n)


Int8Linear = Callable[..., torch.Tensor]   # (x, qweight, scale, bias=None) -> out


@dataclass(frozen=True)
class RowSplit:
    """An int8_linear that sends x with min_rows rows or more to `many`, fewer to `few`."""
    few: Int8Linear
    many: Int8Linear
    min_rows: int

    def __call__(self, x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                 bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        rows = math.prod(x.shape[:-1])
        fn = self.many if rows >= self.min_rows else self.few
        return fn(x, qweight, scale, bias)
