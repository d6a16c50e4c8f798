"""bf16 linear layers on the CPU through oneDNN, for fp32 models on CPUs with bf16 GEMMs.

pack() rounds a weight to bf16 once, at load, and reorders it into oneDNN's blocked
layout; pack_unblocked() only rounds it, for CPUs where oneDNN cannot block bf16 (it needs
avx512bw/vl/dq or avx_ne_convert; kernels/cpu/features.py). linear() rounds x to bf16,
runs the bf16 GEMM (fp32 accumulation inside oneDNN), and returns x's dtype; the bias is
added after, in x's dtype, so that it is not rounded to bf16.

A weight that is not bf16 after packing (fp16, or a tied lm head that is the fp32
embedding and never went through pack) takes the fp32 path of kernels/cpu/linear.py.
kernels/dispatch.py picks this module where the CPU has avx512_bf16 or amx_bf16; on
other CPUs oneDNN emulates bf16, several times slower than fp32, so only a forced plan
runs it there (tests, benchmarks/lowp_quality.py).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from kernels.cpu import linear as fp32_linear

_ROUNDED = (torch.float32, torch.bfloat16)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight: [N, K] fp32 or bf16 -> bf16 in oneDNN's layout; other weights as they are."""
    rounded = pack_unblocked(weight)
    if rounded.dtype != torch.bfloat16 or not fp32_linear.available():
        return rounded
    packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(rounded, fp32_linear.BATCH_HINT)
    return packed


def pack_unblocked(weight: torch.Tensor) -> torch.Tensor:
    """weight: [N, K] fp32 or bf16 -> a plain bf16 [N, K]; other weights as they are."""
    if weight.dtype not in _ROUNDED or weight.device.type != "cpu":
        return weight
    return weight.to(torch.bfloat16).contiguous()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x: [..., K] -> [..., N] in x's dtype."""
    if weight.dtype != torch.bfloat16:
        return fp32_linear.linear(x, weight, bias)
    xb = x.to(torch.bfloat16)
    out: torch.Tensor
    if weight.is_mkldnn:
        out = torch.ops.mkldnn._linear_pointwise(xb, weight, None, "none", [], "")
    else:
        out = F.linear(xb, weight)
    out = out.to(x.dtype)
    return out + bias.to(x.dtype) if bias is not None else out
