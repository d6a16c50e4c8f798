"""W8A8 on the CPU: int8 weights times int8 activations quantized per token at run time.

w8a8_linear has the signature of kernels/int8.py:int8_linear and computes its W8A8
definition, int8.w8a8_linear_ref: x's few outlier channels are set apart in fp32
(kernels/int8.py says why) and the rest quantized per token with a zero point, in one
pass of kernels/cpu/w8a8_quant.c; torch._int_mm multiplies int8 by int8 into exact int32
sums (oneDNN's gemm_s8s8s32, which uses the VNNI or AMX instructions where the CPU has
them); one more pass of w8a8_quant.c applies the zero points, the per-token and
per-channel scales and the outlier channels to the [T, N] result. The int8 weight is the
one quantization="int8" already stores ([N, K], read transposed in place: no copy).

kernels/dispatch.py puts a RowSplit in KernelSet.int8_linear when the CPU has int8
dot products: W8A8 from min_rows rows of x up (with outliers=0 for weights smoothed at load,
kernels/dispatch.py:every_channel_w8a8), the weight-only kernel below
(kernels/cpu/features.py says why). Without them oneDNN's int8 GEMM runs on plain AVX2,
far slower than the fp32 GEMM of the same shape, so only a forced plan
(tests, benchmarks/lowp_quality.py) runs it on such a CPU.
"""
from __future__ import annotations

import ctypes
from typing import Optional

import torch

from kernels import int8
from kernels.cpu.build import function

_quantize = function("w8a8_quant", "w8a8_quantize",
                     [ctypes.c_void_p] + [ctypes.c_int64] * 4 + [ctypes.c_void_p] * 5 + [ctypes.c_int],
                     restype=ctypes.c_int)
_epilogue = function("w8a8_quant", "w8a8_epilogue",
                     [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 6 + [ctypes.c_int64]
                     + [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int], restype=ctypes.c_int)


def available() -> bool:
    return hasattr(torch, "_int_mm")


def w8a8_linear(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                bias: Optional[torch.Tensor] = None, outliers: int = int8.W8A8_OUTLIERS) -> torch.Tensor:
    """x: [..., K], qweight: [N, K] int8, scale: [N], bias: [N] -> [..., N] in x's dtype."""
    n, k = qweight.shape
    x2 = x.reshape(-1, k)
    if x2.dtype != torch.float32 or x2.stride(-1) != 1:
        x2 = x2.float().contiguous()
    rows, c = x2.shape[0], min(outliers, k)
    if rows == 0:
        return x.new_empty(*x.shape[:-1], n)
    # A row of ones under x's rows (w8a8_quant.c writes it): the same GEMM also sums each
    # weight row, which the zero points need (sum_k (xq - zero) w = sum_k xq w - zero *
    # sum_k w), at one row's cost.
    xq = torch.empty(rows + 1, k, dtype=torch.int8)
    xscale, zero = torch.empty(rows), torch.empty(rows, dtype=torch.int32)
    outlying, cols = torch.empty(rows, c), torch.empty(c, dtype=torch.int64)
    threads = torch.get_num_threads()
    if _quantize(x2, x2.stride(0), rows, k, c, xq, xscale, zero,
                 outlying, cols, threads) != 0:
        raise MemoryError("w8a8_linear: no memory for the column maxima")
    acc = torch._int_mm(xq, qweight.t())                      # [T + 1, N] int32, exact
    scale = scale.to(torch.float32).contiguous()
    bias = None if bias is None else bias.to(torch.float32).contiguous()
    out = torch.empty(rows, n)
    if _epilogue(acc, rows, n, zero, xscale, scale,
                 bias, outlying, qweight.contiguous(),
                 k, cols, c, out, threads) != 0:
        raise MemoryError("w8a8_linear: no memory for the outlier channels' weights")
    return out.to(x.dtype).reshape(*x.shape[:-1], n)
