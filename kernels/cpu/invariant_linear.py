"""linear for the engine's batch-invariant mode (invariant_linear.c): fp32, every output
element summed in one fixed order whatever the batch, so a request's logits are the same
bits alone or batched (runtime/core/config.py `batch_invariant`).

Same signature and, up to summation order, the same result as kernels/linear.py; slower
than oneDNN's GEMM (kernels/cpu/linear.py), which picks its blocking by the shape.
Weights stay plain [N, K] tensors: pack() keeps them as they are.
"""
from __future__ import annotations

import ctypes
from typing import Optional

import torch

from kernels.cpu.build import function

_fn = function("invariant_linear", "invariant_linear_f32",
               [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
               + [ctypes.c_int64] * 3 + [ctypes.c_int])


def pack(weight: torch.Tensor) -> torch.Tensor:
    return weight.contiguous()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    if not (x.dtype == weight.dtype == torch.float32 and x.device.type == "cpu"
            and (bias is None or bias.dtype == torch.float32)):
        raise TypeError("invariant linear: fp32 CPU tensors only (batch_invariant is checked at load)")
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    weight = weight.contiguous()
    bias = None if bias is None else bias.contiguous()
    out = torch.empty(rows.shape[0], weight.shape[0], dtype=torch.float32)
    _fn(rows, rows.stride(0), weight, bias,
        out, rows.shape[0], weight.shape[0], weight.shape[1], torch.get_num_threads())
    return out.view(*x.shape[:-1], weight.shape[0])
