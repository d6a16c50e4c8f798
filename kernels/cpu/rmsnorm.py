"""rms_norm and fused_add_rms_norm on the CPU (rmsnorm.c), signatures of kernels/rmsnorm.py.

fp32 in C, one pass per row; bf16 and fp16 are passed to the reference.
"""
from __future__ import annotations

import ctypes

import torch

from kernels import rmsnorm
from kernels.cpu.build import function

_fn = function("rmsnorm", "rms_norm_f32", [ctypes.c_void_p, ctypes.c_int64] * 2
               + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_float, ctypes.c_int])


def _in_c(*rows: torch.Tensor, weight: torch.Tensor) -> bool:
    """What the C kernel reads: fp32 [T, H] rows of unit column stride, an fp32 [H] weight."""
    return (all(r.dtype == torch.float32 and r.dim() == 2 and r.stride(1) == 1 for r in rows)
            and weight.dtype == torch.float32 and weight.is_contiguous())


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if not _in_c(x, weight=weight):
        return rmsnorm.rms_norm(x, weight, eps)
    out = torch.empty(x.shape, dtype=x.dtype)
    _fn(x, x.stride(0), None, 0, weight, out, None,
        x.shape[0], x.shape[1], eps, torch.get_num_threads())
    return out


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    if not _in_c(x, residual, weight=weight):
        return rmsnorm.fused_add_rms_norm(x, residual, weight, eps)
    out = torch.empty(x.shape, dtype=x.dtype)
    residual_out = torch.empty(x.shape, dtype=x.dtype)
    _fn(x, x.stride(0), residual, residual.stride(0), weight,
        out, residual_out, x.shape[0], x.shape[1], eps,
        torch.get_num_threads())
    return out, residual_out
