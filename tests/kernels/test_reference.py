"""The pure-torch references against naive math, over a grid of shapes."""
from __future__ import annotations

import math

import pytest
import torch

from kernels.activation import gelu_and_mul
from kernels.attention import (paged_decode_attention, paged_prefill_attention,
                               prefill_attention, write_kv)
from kernels.rmsnorm import fused_add_rms_norm, rms_norm
from kernels.rotary import apply_rotary, rotary_cos_sin

torch.manual_seed(0)


def naive_attention(q, k, v, q_pos, scale, window=None, softcap=None):
    """q [n,nh,D] at positions q_pos, k/v [L,nkv,D] for positions 0..L-1, causal; window:
    position p sees p - window < j <= p; softcap: c * tanh(score / c)."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    j, p = torch.arange(k.shape[0])[None, :], torch.tensor(q_pos)[:, None]
    mask = (j > p) | ((j <= p - window) if window is not None else False)
    scores = scores.masked_fill(mask[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def paged(seqs_k, seqs_v, num_blocks, bs):
    """Scatter per-sequence k/v into a shuffled paged cache; return cache and tables."""
    nkv, d = seqs_k[0].shape[1:]
    k_cache = torch.zeros(num_blocks, bs, nkv, d)
    v_cache = torch.zeros_like(k_cache)
    free = torch.randperm(num_blocks).tolist()
    tables = []
    for k, v in zip(seqs_k, seqs_v):
        n = k.shape[0]
        table = [free.pop() for _ in range(math.ceil(n / bs))]
        slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(n)])
        write_kv(k, v, k_cache, v_cache, slots)
        tables.append(table)
    width = max(len(t) for t in tables)
    return k_cache, v_cache, torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)


@pytest.mark.parametrize("nh,nkv,d,bs", [(4, 4, 16, 4), (8, 2, 32, 16), (6, 1, 8, 8)])
def test_paged_decode_matches_naive(nh, nkv, d, bs):
    lens = [1, 7, 33, 16]
    ks = [torch.randn(n, nkv, d) for n in lens]
    vs = [torch.randn(n, nkv, d) for n in lens]
    k_cache, v_cache, tables = paged(ks, vs, 40, bs)
    q = torch.randn(len(lens), nh, d)
    out = paged_decode_attention(q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32),
                                 d ** -0.5)
    for b, n in enumerate(lens):
        ref = naive_attention(q[b:b + 1], ks[b], vs[b], [n - 1], d ** -0.5)
        torch.testing.assert_close(out[b:b + 1], ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("nh,nkv,d,bs", [(4, 2, 16, 4), (8, 8, 32, 16)])
def test_chunked_prefill_matches_naive(nh, nkv, d, bs):
    ctx = [12, 30, 5]
    q_lens = [4, 30, 2]                      # a chunk after a cached prefix, a fresh prompt, a tail
    ks = [torch.randn(n, nkv, d) for n in ctx]
    vs = [torch.randn(n, nkv, d) for n in ctx]
    k_cache, v_cache, tables = paged(ks, vs, 30, bs)
    q = torch.randn(sum(q_lens), nh, d)
    out = paged_prefill_attention(q, k_cache, v_cache, tables, q_lens, ctx, d ** -0.5)
    start = 0
    for s, (n, c) in enumerate(zip(q_lens, ctx)):
        ref = naive_attention(q[start:start + n], ks[s], vs[s], list(range(c - n, c)), d ** -0.5)
        torch.testing.assert_close(out[start:start + n], ref, atol=1e-5, rtol=1e-5)
        start += n


def test_prefill_without_cache_matches_naive():
    lens = [3, 9]
    q, k, v = torch.randn(12, 4, 8), torch.randn(12, 2, 8), torch.randn(12, 2, 8)
    out = prefill_attention(q, k, v, lens, 0.3)
    torch.testing.assert_close(out[:3], naive_attention(q[:3], k[:3], v[:3], [0, 1, 2], 0.3))
    torch.testing.assert_close(out[3:], naive_attention(q[3:], k[3:], v[3:], list(range(9)), 0.3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_and_fused_add(dtype):
    x, r, w = torch.randn(5, 64, dtype=dtype), torch.randn(5, 64, dtype=dtype), torch.randn(64, dtype=dtype)
    ref = (x.float() / torch.sqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype) * w
    torch.testing.assert_close(rms_norm(x, w, 1e-6), ref)
    normed, residual = fused_add_rms_norm(x, r, w, 1e-6)
    torch.testing.assert_close(residual, x + r)
    torch.testing.assert_close(normed, rms_norm(x + r, w, 1e-6))


def test_rotary_matches_rotate_half_convention():
    positions = torch.tensor([0, 1, 5, 100])
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
    cos, sin = rotary_cos_sin(positions, inv_freq)
    x = torch.randn(4, 3, 16)
    emb = torch.cat([positions[:, None].float() * inv_freq] * 2, dim=-1)
    rotated = torch.cat([-x[..., 8:], x[..., :8]], dim=-1)
    ref = x * emb.cos()[:, None] + rotated * emb.sin()[:, None]
    torch.testing.assert_close(apply_rotary(x, cos, sin), ref)
    torch.testing.assert_close(apply_rotary(x[:1], cos[:1], sin[:1]), x[:1])   # position 0


# (window, softcap): sliding windows narrower and wider than a block, alone and soft-capped
WINDOWED = [(5, None), (16, None), (None, 2.0), (7, 2.0), (1, None)]


@pytest.mark.parametrize("window,softcap", WINDOWED)
@pytest.mark.parametrize("nh,nkv,d,bs", [(4, 2, 16, 4), (6, 1, 8, 8)])
def test_paged_decode_window_and_softcap_match_naive(window, softcap, nh, nkv, d, bs):
    lens = [1, 7, 33, 16, 40]
    ks = [torch.randn(n, nkv, d) for n in lens]
    vs = [torch.randn(n, nkv, d) for n in lens]
    k_cache, v_cache, tables = paged(ks, vs, 50, bs)
    q = torch.randn(len(lens), nh, d) * 3
    out = paged_decode_attention(q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32),
                                 d ** -0.5, window=window, softcap=softcap, group_size=2)
    for b, n in enumerate(lens):
        ref = naive_attention(q[b:b + 1], ks[b], vs[b], [n - 1], d ** -0.5, window, softcap)
        torch.testing.assert_close(out[b:b + 1], ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window,softcap", WINDOWED)
def test_prefill_window_and_softcap_match_naive(window, softcap):
    nh, nkv, d, bs = 4, 2, 16, 4
    ctx, q_lens = [12, 30, 5], [4, 30, 2]
    ks = [torch.randn(n, nkv, d) for n in ctx]
    vs = [torch.randn(n, nkv, d) for n in ctx]
    k_cache, v_cache, tables = paged(ks, vs, 30, bs)
    q = torch.randn(sum(q_lens), nh, d) * 3
    paged_out = paged_prefill_attention(q, k_cache, v_cache, tables, q_lens, ctx, d ** -0.5, window, softcap)
    start = 0
    for s, (n, c) in enumerate(zip(q_lens, ctx)):
        ref = naive_attention(q[start:start + n], ks[s], vs[s], list(range(c - n, c)), d ** -0.5, window, softcap)
        torch.testing.assert_close(paged_out[start:start + n], ref, atol=1e-5, rtol=1e-5)
        if n == c:                               # nothing cached: the gather-free path too
            fresh = prefill_attention(q[start:start + n], ks[s], vs[s], [n], d ** -0.5, window, softcap)
            torch.testing.assert_close(fresh, ref, atol=1e-5, rtol=1e-5)
        start += n


def test_gelu_and_mul_is_geglu():
    x = torch.randn(5, 24)
    gate, up = x[:, :12], x[:, 12:]
    tanh_gelu = 0.5 * gate * (1 + torch.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate ** 3)))
    torch.testing.assert_close(gelu_and_mul(x), tanh_gelu * up)
