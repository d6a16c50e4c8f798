"""apply_rotary on the CPU (rotary.c), signature of kernels/rotary.py.

fp32 in C, reading q or k where they lie in the fused qkv output; bf16 and fp16
are passed to the reference.
"""
from __future__ import annotations

import ctypes

import torch

from kernels import rotary
from kernels.cpu.build import function

_fn = function("rotary", "apply_rotary_f32", [ctypes.c_void_p, ctypes.c_int64]
               + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int])


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    tokens, heads, dim = x.shape
    if x.dtype != torch.float32 or x.stride(2) != 1 or x.stride(1) != dim:
        return rotary.apply_rotary(x, cos, sin)
    cos = cos.to(torch.float32).contiguous()
    sin = sin.to(torch.float32).contiguous()
    out = torch.empty(x.shape, dtype=x.dtype)
    _fn(x, x.stride(0), cos, sin, out,
        tokens, heads, dim, torch.get_num_threads())
    return out
