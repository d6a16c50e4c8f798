"""lora_delta on the CPU (lora.c), signature of kernels/lora.py: fp32 in C, each row its
own adapter; anything else (other dtypes, a rank wider than the C kernel holds) goes to
the reference."""
from __future__ import annotations

import ctypes

import torch

from kernels import lora
from kernels.cpu.build import function

_P, _I64 = ctypes.c_void_p, ctypes.c_int64
_fn = function("lora", "lora_delta_f32", [_P, _I64, _P, _P, _P, _P] + [_I64] * 5 + [ctypes.c_int],
               restype=ctypes.c_int)
MAX_RANK = 1024


def lora_delta(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    rows, k = x.shape
    num_slots, r, _ = a.shape
    in_c = (x.dtype == a.dtype == b.dtype == torch.float32 and x.stride(1) == 1 and a.is_contiguous()
            and b.is_contiguous() and slots.dtype == torch.long and slots.is_contiguous() and r <= MAX_RANK)
    if not in_c:
        return lora.lora_delta(x, a, b, slots)
    out = torch.empty(rows, b.shape[1])
    if _fn(x, x.stride(0), a, b, slots, out, rows, k, r, b.shape[1], num_slots, torch.get_num_threads()) != 0:
        raise ValueError("lora_delta: a slot outside the adapter slots")
    return out
