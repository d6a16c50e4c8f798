"""Memory for the KV cache that costs nothing until it is used.

The cache must read as zeros before it is written: attention multiplies the probability
0 of a masked position by whatever its V slot holds, and garbage there (a NaN) would
reach the output; the block manager's null block, behind a sliding window, is never
written at all. On the CPU, `torch.zeros` writes every byte up front (seconds for a
budget of gigabytes); a fresh anonymous mapping is zero by the kernel's guarantee and
gets its pages one at a time, on the first write to each, so the cache is allocated in
no time and costs memory only as sequences fill it. A GPU zeroes at hundreds of GB/s and
has no lazy pages: there it stays `torch.zeros`.

Its dtype is the model's, or bf16 when the engine asks for it (kv_cache_dtype="bfloat16"):
half an fp32 cache's bytes, so twice the tokens in the same budget and half the bytes
that decode attention reads; the model keeps computing in its own dtype (k/v are rounded
as they are written, widened as they are read: kernels/attention.py).
"""
from __future__ import annotations

import math
import mmap

import torch


def kv_cache_dtype(setting: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache's dtype for EngineConfig.kv_cache_dtype: "auto" the model's, "bfloat16" bf16."""
    return torch.bfloat16 if setting == "bfloat16" else model_dtype


def zeros_untouched(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    """A tensor of zeros; on the CPU none of its pages is touched until written."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    numel = math.prod(shape)
    if numel == 0:
        return torch.zeros(shape, dtype=dtype)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    # the tensor's storage keeps the mapping alive; it is unmapped with the last view
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(pages, dtype=dtype).view(shape)
