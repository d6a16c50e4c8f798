"""Attention over the paged KV cache: pure-torch references (the oracle for faster kernels).

KV layout per layer: k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim].
A token at position p of a sequence lives in slot block_table[p // block_size] * block_size
+ p % block_size. GQA: query head h reads kv head h // (num_heads // num_kv_heads).

Every attention below takes two optional keywords:
    window: a query at position p sees kv positions p - window < j <= p only (sliding-window
        attention, transformers' convention); None: every earlier position.
    softcap: scores are capped as softcap * tanh(score / softcap) before the softmax
        (Gemma 2); None: no cap.
Block-table entries of blocks wholly before every query's window are never attended to
(the block manager points them at its null block).

The cache may be of a narrower dtype than q (kv_cache_dtype="bfloat16" under an fp32
model): write_kv rounds k/v to it (to nearest, ties to even), and the attentions read it
back widened to q's dtype, so their arithmetic is q's.

write_kv(k [T,nkv,D], v [T,nkv,D], k_cache, v_cache, slot_mapping [T] long) -> None (in place)

paged_decode_attention(q [B,nh,D], k_cache, v_cache, block_tables [B,max_blocks] int32,
                       context_lens [B] int32, scale, window=None, softcap=None) -> [B,nh,D]
    one query per sequence, at position context_lens[b]-1; its own k/v already written.
    Entries of block_tables past a sequence's last block are ignored (pad with any id).

paged_prefill_attention(q [T,nh,D], k_cache, v_cache, block_tables [S,max_blocks] int32,
                        query_lens list[int] (S), context_lens list[int] (S), scale,
                        window=None, softcap=None) -> [T,nh,D]
    varlen causal attention for chunks: sequence s owns query_lens[s] consecutive rows of q,
    the last ones of its context of context_lens[s] tokens (cached prefix + earlier chunks +
    this chunk, all already written); query i sees kv positions <= context - query_len + i.

prefill_attention(q [T,nh,D], k [T,nkv,D], v [T,nkv,D], query_lens list[int], scale,
                  window=None, softcap=None)
    -> [T,nh,D]: the same when nothing is cached yet (no gather; causal per sequence).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    num_kv, dim = k_cache.shape[2], k_cache.shape[3]
    # index_copy_ takes only the cache's own dtype; .to is a no-op when they agree
    k_cache.view(-1, num_kv, dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, num_kv, dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[num_blocks, bs, nkv, D] x [B, max_blocks] -> [B, nkv, max_blocks*bs, D]"""
    b, max_blocks = block_tables.shape
    bs, num_kv, dim = cache.shape[1:]
    gathered = cache.index_select(0, block_tables.reshape(-1).long())
    return gathered.view(b, max_blocks * bs, num_kv, dim).transpose(1, 2)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float, window: Optional[int] = None,
                           softcap: Optional[float] = None, group_size: int = 16) -> torch.Tensor:
    b = q.shape[0]
    if b <= group_size:
        return _decode_group(q, k_cache, v_cache, block_tables, context_lens, scale, window, softcap)
    # Sequences sorted by length and taken group_size at a time, each group gathered only up
    # to its own longest context: the padding (gathered and attended for nothing) stays small.
    lens = context_lens.tolist()
    order = sorted(range(b), key=lens.__getitem__)
    out = torch.empty_like(q)
    block_size = k_cache.shape[1]
    for start in range(0, b, group_size):
        rows = order[start:start + group_size]
        width = -(-lens[rows[-1]] // block_size)
        index = torch.tensor(rows, device=q.device)
        out[index] = _decode_group(q[index], k_cache, v_cache, block_tables[index, :width],
                                   context_lens[index], scale, window, softcap)
    return out


def _decode_group(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                  context_lens: torch.Tensor, scale: float, window: Optional[int],
                  softcap: Optional[float]) -> torch.Tensor:
    b, num_heads, dim = q.shape
    num_kv = k_cache.shape[2]
    k = gather_kv(k_cache, block_tables).to(q.dtype)          # [B, nkv, L, D]
    v = gather_kv(v_cache, block_tables).to(q.dtype)
    positions = torch.arange(k.shape[2], device=q.device)[None, :]
    lens = context_lens.to(q.device).long()[:, None]
    seen = positions < lens                                   # [B, L]
    if window is not None:
        seen &= positions >= lens - window
    # the query heads sharing a kv head ride along as query rows: [B, nkv, group, D]
    # (no kv repeat, and several times faster on the CPU than one row per head)
    out = _attend(q.view(b, num_kv, num_heads // num_kv, dim), k, v, seen[:, None, None, :],
                  scale, softcap)
    return out.reshape(b, num_heads, dim)


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_lens: list[int],
                            context_lens: list[int], scale: float, window: Optional[int] = None,
                            softcap: Optional[float] = None) -> torch.Tensor:
    outs, start = [], 0
    block_size = k_cache.shape[1]
    for s, (q_len, ctx) in enumerate(zip(query_lens, context_lens)):
        n_blocks = -(-ctx // block_size)
        table = block_tables[s:s + 1, :n_blocks]
        k = gather_kv(k_cache, table)[:, :, :ctx]             # [1, nkv, ctx, D]
        v = gather_kv(v_cache, table)[:, :, :ctx]
        outs.append(_causal(q[start:start + q_len], k, v, ctx - q_len, scale, window, softcap))
        start += q_len
    return torch.cat(outs, dim=0)


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      query_lens: list[int], scale: float, window: Optional[int] = None,
                      softcap: Optional[float] = None) -> torch.Tensor:
    outs, start = [], 0
    for q_len in query_lens:
        end = start + q_len
        ks = k[start:end].transpose(0, 1)[None]               # [1, nkv, q_len, D]
        vs = v[start:end].transpose(0, 1)[None]
        outs.append(_causal(q[start:end], ks, vs, 0, scale, window, softcap))
        start = end
    return torch.cat(outs, dim=0)


def _causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offset: int, scale: float,
            window: Optional[int], softcap: Optional[float]) -> torch.Tensor:
    """q [n, nh, D] at positions offset..offset+n-1 against k/v [1, nkv, offset+n, D]."""
    qs = q.transpose(0, 1)[None]                              # [1, nh, n, D]
    k, v = k.to(q.dtype), v.to(q.dtype)                       # a bf16 cache under fp32 q
    if offset == 0 and window is None and softcap is None:
        out = F.scaled_dot_product_attention(qs, k, v, is_causal=True, scale=scale,
                                             enable_gqa=True)
    else:
        rows = torch.arange(q.shape[0], device=q.device)[:, None] + offset
        cols = torch.arange(k.shape[2], device=q.device)[None, :]
        seen = cols <= rows                                   # [n, L]
        if window is not None:
            seen &= cols > rows - window
        out = _attend(qs, k, v, seen, scale, softcap)
    return out[0].transpose(0, 1)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seen: torch.Tensor, scale: float,
            softcap: Optional[float]) -> torch.Tensor:
    """q [..., hq, n, D], k/v [..., hkv, L, D] (hq a multiple of hkv), seen: bool mask
    broadcast to [..., hq, n, L] -> [..., hq, n, D]. Soft-capped scores are computed as
    transformers' eager attention does: capped in the input dtype, softmax in fp32."""
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=seen, scale=scale, enable_gqa=True)
    group = q.shape[-3] // k.shape[-3]
    k = k.repeat_interleave(group, dim=-3)
    v = v.repeat_interleave(group, dim=-3)
    scores = torch.tanh(q @ k.transpose(-1, -2) * scale / softcap) * softcap
    scores = scores.masked_fill(~seen, float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v
