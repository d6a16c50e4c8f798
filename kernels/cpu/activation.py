"""silu_and_mul on the CPU (activation.c), signature of kernels/activation.py.

fp32 in C, one pass; bf16 and fp16 are passed to the reference.
"""
from __future__ import annotations

import ctypes

import torch

from kernels import activation
from kernels.cpu.build import function

_fn = function("activation", "silu_and_mul_f32",
               [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2 + [ctypes.c_int])


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float32 or x.dim() != 2 or not x.is_contiguous():
        return activation.silu_and_mul(x)
    rows, width = x.shape[0], x.shape[1] // 2
    out = torch.empty(rows, width, dtype=x.dtype)
    _fn(x, out, rows, width, torch.get_num_threads())
    return out
