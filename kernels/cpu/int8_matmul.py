"""int8_linear on the CPU (int8_matmul.c), signature of kernels/int8.py:int8_linear.

fp32 activations up to MAX_ROWS rows (decode steps, short prefills; the C build says
how many it is faster for): the C kernel
reads 1 byte per weight and keeps x in fp32, so the result is the definition
(int8_linear_ref) up to summation order; at one row it took a fifth to a ninth of an
fp32 GEMV's time on a 4096 x 4096 weight, and less than torch's int8 GEMV, which rounds
x to bf16. More rows, and other dtypes, take the torch path of kernels/int8.py.
"""
from __future__ import annotations

import ctypes

import torch

from kernels import int8
from kernels.cpu.build import function

_fn = function("int8_matmul", "int8_linear_f32",
               [ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3
               + [ctypes.c_int], restype=ctypes.c_int)
# Up to this many rows the kernel beats the torch path (MKL over a converted weight); it
# depends on the build: AVX-512's widened panels serve 256 rows, AVX2's plain loops ~24.
MAX_ROWS = int(function("int8_matmul", "int8_linear_max_rows", [], restype=ctypes.c_int64)())


def int8_linear(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    n, k = qweight.shape
    x2 = x.reshape(-1, k)
    if x.dtype != torch.float32 or not 0 < x2.shape[0] <= MAX_ROWS or x2.stride(-1) != 1:
        return int8.int8_linear(x, qweight, scale, bias)
    qweight, scale = qweight.contiguous(), scale.to(torch.float32).contiguous()
    out = torch.empty(x2.shape[0], n, dtype=torch.float32)
    status = _fn(x2, x2.stride(0), qweight, scale, out,
                 x2.shape[0], n, k, torch.get_num_threads())
    if status != 0:
        raise MemoryError("int8_linear: no memory for the widened weight panels")
    if bias is not None:
        out += bias.to(torch.float32)
    return out.reshape(*x.shape[:-1], n)
