"""paged_decode_attention and paged_prefill_attention on the CPU, reading the paged KV
cache in place (paged_attention.c).

Same signatures and results as the references in kernels/attention.py, which gather
every sequence's blocks into a contiguous copy each step; these read each k and v
row in place instead (no per-step copy of the cache: benchmarks/kernels.py). With a sliding
window they read only the windows' rows. Prefill is flash-style: tiles of keys with an
online softmax, so no [query, context] score matrix is built. The C kernels compute in
fp32 over an fp32 cache, or over a bf16 one (kv_cache_dtype="bfloat16": each row widened
as it is read, half the bytes); other dtypes go to the reference.
"""
from __future__ import annotations

import ctypes
import itertools
from typing import Callable, Optional

import torch

from kernels import attention
from kernels.cpu.build import function


def _kernels(name: str, pointers: int) -> dict[torch.dtype, Callable[..., int]]:
    """paged_attention.c's `name`_f32 and `name`_bf16kv by the caches' dtype (q and out
    are fp32 with either): `pointers` tensors, 6 ints, then scale, window, softcap, threads."""
    types = [ctypes.c_void_p] * pointers + [ctypes.c_int64] * 6 + [ctypes.c_float, ctypes.c_int64,
                                                                  ctypes.c_float, ctypes.c_int]
    return {dtype: function("paged_attention", f"{name}_{suffix}", types, restype=ctypes.c_int)
            for dtype, suffix in ((torch.float32, "f32"), (torch.bfloat16, "bf16kv"))}


DECODE_KERNELS = _kernels("paged_decode_attention", 6)
PREFILL_KERNELS = _kernels("paged_prefill_attention", 7)
_write_kv = function("paged_attention", "write_kv_f32",
                     [ctypes.c_void_p, ctypes.c_int64] * 2 + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3,
                     restype=ctypes.c_int)


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """kernels/attention.py:write_kv, in C for fp32 k, v and caches (a bf16 cache rounds
    in the reference); k and v may be views of the fused qkv output (rows apart)."""
    tokens, num_kv_heads, dim = k.shape
    rows_whole = all(t.dtype == torch.float32 and t.stride(2) == 1 and t.stride(1) == dim for t in (k, v))
    if not (rows_whole and k_cache.dtype == v_cache.dtype == torch.float32 and k_cache.is_contiguous()
            and v_cache.is_contiguous() and slot_mapping.dtype == torch.long and slot_mapping.is_contiguous()):
        attention.write_kv(k, v, k_cache, v_cache, slot_mapping)
        return
    width = num_kv_heads * dim
    if _write_kv(k, k.stride(0), v, v.stride(0), k_cache,
                 v_cache, slot_mapping, tokens, width, k_cache.numel() // width) != 0:
        raise ValueError("write_kv: a slot outside the cache")


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float, window: Optional[int] = None,
                           softcap: Optional[float] = None) -> torch.Tensor:
    fn = c_kernel(DECODE_KERNELS, q, k_cache, v_cache)
    if fn is None:
        return attention.paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale,
                                                window, softcap)
    _check_options("paged_decode_attention", k_cache, v_cache, window, softcap)
    batch, num_heads, dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    q = q.contiguous()
    tables = block_tables.to(torch.int32).contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    if batch and not 1 <= int(lens.min()) <= int(lens.max()) <= tables.shape[1] * block_size:
        # the C code trusts them: past the table it would read memory that is not the cache
        raise ValueError("paged_decode_attention: context_lens must be in [1, block_tables "
                         "width * block_size]")
    out = torch.empty_like(q)
    status = fn(q, k_cache, v_cache, tables,
                lens, out, batch, num_heads, num_kv_heads, dim,
                block_size, tables.shape[1], scale, window or 0, softcap or 0.0,
                torch.get_num_threads())
    if status != 0:
        raise MemoryError("paged_decode_attention: no memory for the attention scores")
    return out


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_lens: list[int],
                            context_lens: list[int], scale: float, window: Optional[int] = None,
                            softcap: Optional[float] = None) -> torch.Tensor:
    fn = c_kernel(PREFILL_KERNELS, q, k_cache, v_cache)
    if fn is None:
        return attention.paged_prefill_attention(q, k_cache, v_cache, block_tables, query_lens,
                                                 context_lens, scale, window, softcap)
    _check_options("paged_prefill_attention", k_cache, v_cache, window, softcap)
    _, block_size, num_kv_heads, _ = k_cache.shape
    width = block_tables.shape[1] * block_size
    if sum(query_lens) != q.shape[0] or not all(
            1 <= n <= ctx <= width for n, ctx in zip(query_lens, context_lens, strict=True)):
        # the C code trusts them: past the table it would read memory that is not the cache
        raise ValueError("paged_prefill_attention: query_lens must sum to q's rows, and each "
                         "1 <= query_len <= context_len <= block_tables width * block_size")
    q = q.contiguous()
    starts = torch.tensor([0, *query_lens], dtype=torch.int64).cumsum(0).to(torch.int32)
    tables = block_tables.to(torch.int32).contiguous()
    lens = torch.tensor(context_lens, dtype=torch.int32)
    out = torch.empty_like(q)
    status = fn(q, k_cache, v_cache, tables,
                starts, lens, out, len(query_lens),
                q.shape[1], num_kv_heads, q.shape[2], block_size, tables.shape[1], scale,
                window or 0, softcap or 0.0, torch.get_num_threads())
    if status != 0:
        raise MemoryError("paged_prefill_attention: no memory for the attention scratch")
    return out


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_lens: list[int],
                      scale: float, window: Optional[int] = None,
                      softcap: Optional[float] = None) -> torch.Tensor:
    """Nothing cached yet: k/v [T, nkv, D] are read as a cache of one-token blocks, each
    sequence's table listing its own rows, so the same kernel serves (bf16 k/v: the
    bf16-cache one)."""
    t, num_kv_heads, dim = k.shape
    starts = [0, *itertools.accumulate(query_lens)][:-1]
    width = max(query_lens, default=1)
    tables = torch.zeros(len(query_lens), width, dtype=torch.int32)
    for s, (start, n) in enumerate(zip(starts, query_lens)):
        tables[s, :n] = torch.arange(start, start + n, dtype=torch.int32)
    as_cache = (t, 1, num_kv_heads, dim)
    return paged_prefill_attention(q, k.contiguous().view(as_cache), v.contiguous().view(as_cache),
                                   tables, query_lens, query_lens, scale, window, softcap)


def c_kernel(kernels: dict[torch.dtype, Callable[..., int]], q: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor) -> Optional[Callable[..., int]]:
    """Of DECODE_KERNELS or PREFILL_KERNELS, the one for fp32 q over these caches; None:
    the reference serves them."""
    if q.dtype != torch.float32 or v_cache.dtype != k_cache.dtype:
        return None
    return kernels.get(k_cache.dtype)


def _check_options(name: str, k_cache: torch.Tensor, v_cache: torch.Tensor, window: Optional[int],
                   softcap: Optional[float]) -> None:
    if (window is not None and window < 1) or (softcap is not None and softcap <= 0):
        raise ValueError(f"{name}: window must be >= 1 and softcap > 0 when given")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError(f"{name}: k_cache and v_cache must be contiguous")
