"""fp32 linear layers on the CPU through oneDNN with prepacked weights.

pack() reorders an fp32 weight once, at load, into oneDNN's blocked layout (an opaque
mkldnn tensor: only linear() and to_dense() can read it); linear() then runs oneDNN's
GEMM on it, faster than the MKL sgemm behind F.linear over a decoder's shapes
(benchmarks/kernels.py), the result the same up to summation order. Other dtypes, and a torch without oneDNN,
keep the plain weight and F.linear, the reference (kernels/linear.py).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

# oneDNN picks the blocking for this many rows of x; it served 1 to 1024 rows alike.
BATCH_HINT = 1024


def available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def pack(weight: torch.Tensor) -> torch.Tensor:
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or not available():
        return weight
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), BATCH_HINT)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)
