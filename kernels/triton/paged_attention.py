"""Decode attention over the paged KV cache in Triton; one program per (sequence, query head).

paged_decode_attention(q [B,nh,D], k_cache, v_cache, block_tables [B,max_blocks] int32,
                       context_lens [B] int32, scale, window=None, softcap=None) -> [B,nh,D]
k_cache, v_cache: [num_blocks, block_size, nkv, D]; head h reads kv head h // (nh // nkv).
window: only the last `window` positions are attended to, and the walk starts at the
block that holds the first of them; softcap: scores become softcap * tanh(score / softcap).

Each program walks its sequence's block table one KV block at a time with an
online softmax (running max m, running sum l_sum, unnormalized accumulator), so no
[B, L] score matrix is ever materialized and a block past context_len is never
read. Sums are in fp32. head_dim and block_size need not be powers of two: both
are padded to one and masked.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl


LOG2E = 1.4426950408889634


@triton.jit
def _tanh(x):
    # 1 - 2 / (e^2x + 1): saturates to +-1 without overflow (e^2x = inf gives 1)
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _paged_decode_kernel(out_ptr, q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, qk_scale, window, softcap,
                         q_s0, q_s1, o_s0, o_s1, k_s0, k_s1, k_s2, v_s0, v_s1, v_s2, tables_s0,
                         GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, WINDOWED: tl.constexpr,
                         SOFTCAP: tl.constexpr):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    kv_head = (head // GROUP).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    t = tl.arange(0, BLOCK_T)
    # Without a softcap qk_scale carries log2(e), so exp2 below is exp of the scaled scores;
    # with one, log2(e) is applied after the cap.
    q = tl.load(q_ptr + seq * q_s0 + head * q_s1 + d, mask=d_mask, other=0.0).to(tl.float32) * qk_scale
    context_len = tl.load(lens_ptr + seq)
    first = 0
    if WINDOWED:
        first = tl.maximum(context_len - window, 0)
    m = tl.full([], float("-inf"), tl.float32)
    l_sum = tl.zeros([], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for i in range(first // BLOCK_SIZE, tl.cdiv(context_len, BLOCK_SIZE)):
        block = tl.load(tables_ptr + seq * tables_s0 + i).to(tl.int64)
        pos = i * BLOCK_SIZE + t
        t_mask = (t < BLOCK_SIZE) & (pos < context_len) & (pos >= first)
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + block * k_s0 + t[:, None] * k_s1 + kv_head * k_s2 + d[None, :],
                    mask=kv_mask, other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1)
        if SOFTCAP:
            s = softcap * _tanh(s / softcap) * 1.4426950408889634   # log2(e)
        s = tl.where(t_mask, s, float("-inf"))                                  # [BLOCK_T]
        # Every block the loop visits holds at least one live token, so m_new is
        # finite and exp2(m - m_new) is 0, not nan, on the first block.
        m_new = tl.maximum(m, tl.max(s, axis=0))
        p = tl.exp2(s - m_new)
        alpha = tl.exp2(m - m_new)
        v = tl.load(v_ptr + block * v_s0 + t[:, None] * v_s1 + kv_head * v_s2 + d[None, :],
                    mask=kv_mask, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l_sum = l_sum * alpha + tl.sum(p, axis=0)
        m = m_new
    tl.store(out_ptr + seq * o_s0 + head * o_s1 + d, (acc / l_sum).to(out_ptr.dtype.element_ty), mask=d_mask)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float, window: Optional[int] = None,
                           softcap: Optional[float] = None) -> torch.Tensor:
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    if num_heads % num_kv_heads:
        raise ValueError(f"paged_decode_attention: {num_heads} query heads are not a multiple "
                         f"of {num_kv_heads} kv heads")
    if q.stride(-1) != 1:
        q = q.contiguous()
    # The kernel indexes the caches with strides except along head_dim.
    k_cache = k_cache if k_cache.stride(-1) == 1 else k_cache.contiguous()
    v_cache = v_cache if v_cache.stride(-1) == 1 else v_cache.contiguous()
    tables = block_tables.to(torch.int32).contiguous()
    lens = context_lens.to(device=q.device, dtype=torch.int32).contiguous()
    if (window is not None and window < 1) or (softcap is not None and softcap <= 0):
        raise ValueError("paged_decode_attention: window must be >= 1 and softcap > 0 when given")
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if batch and num_heads:
        _paged_decode_kernel[(batch, num_heads)](
            out, q, k_cache, v_cache, tables, lens, scale if softcap is not None else scale * LOG2E,
            window or 0, softcap or 0.0,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), tables.stride(0),
            GROUP=num_heads // num_kv_heads, BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
            BLOCK_T=triton.next_power_of_2(block_size), BLOCK_D=triton.next_power_of_2(head_dim),
            WINDOWED=window is not None, SOFTCAP=softcap is not None)
    return out
