"""lora_delta on the CPU (lora.c), signature of kernels/lora.py: fp32 in C, each row its
own adapter; anything else (other dtypes, strided weights) goes to the reference, and so
do batches of MANY_ROWS rows or more (a prefill's): there the reference's two matmuls
per adapter (oneDNN) outrun the C loops, which win on decode's few rows (2 cores,
SmolLM2's projections, 8 rank-16 adapters: even at 512 rows, 1.2x the C time at 1024)."""
from __future__ import annotations

import ctypes
import itertools
from typing import Sequence

import torch

from kernels import lora
from kernels.cpu.build import function

_P, _I64 = ctypes.c_void_p, ctypes.c_int64
MANY_ROWS = 640
_fn = function("lora", "lora_delta_f32", [_P, _I64, _P, _P, _P, _P] + [_I64] * 5 + [_P, _I64, ctypes.c_int],
               restype=ctypes.c_int)


def lora_delta(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor,
               splits: Sequence[int] = ()) -> torch.Tensor:
    rows, k = x.shape
    if rows >= MANY_ROWS:
        return lora.lora_delta(x, a, b, slots, splits)
    num_slots, r, _ = a.shape
    ends = torch.tensor(list(itertools.accumulate(splits or [b.shape[2]])))
    in_c = (x.dtype == a.dtype == b.dtype == torch.float32 and x.stride(1) == 1 and a.is_contiguous()
            and b.is_contiguous() and slots.dtype == torch.long and slots.is_contiguous()
            and int(ends[-1]) == b.shape[2] and r % len(ends) == 0)
    if not in_c:
        return lora.lora_delta(x, a, b, slots, splits)
    out = torch.empty(rows, b.shape[2])
    if _fn(x, x.stride(0), a, b, slots, out, rows, k, r, b.shape[2], num_slots, ends, len(ends),
           torch.get_num_threads()) != 0:
        raise ValueError("lora_delta: a slot outside the adapter slots (or no memory for the scratch)")
    return out
