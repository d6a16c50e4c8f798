"""The gathered LoRA delta in Triton (Punica's BGMV): one program per (row, block of
output columns), each shrinking its row through its adapter's A (in K blocks) and
expanding the R values through its columns of b, in fp32.

lora_delta(x [T, K], a [L, R, K], b [L, R, N], slots [T] long, splits=()) -> [T, N] fp32
(kernels/lora.py is the reference; a row of slot < 0, the base model, gets zeros). The
programs of one row each redo its shrink (R x K, small against the expand for a wide
projection); a fused projection's zero blocks (splits) are multiplied like the rest.
"""
from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl

BLOCK_N, BLOCK_K = 128, 64


@triton.jit
def _lora_delta_kernel(x_ptr, a_ptr, b_ptr, slots_ptr, out_ptr, x_s0, K, R, N,
                       BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    slot = tl.load(slots_ptr + row)
    used = slot >= 0
    s = tl.where(used, slot, 0).to(tl.int64)
    ranks = tl.arange(0, BLOCK_R)
    h = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        xv = tl.load(x_ptr + row * x_s0 + ks, mask=ks < K, other=0.0).to(tl.float32)
        av = tl.load(a_ptr + s * R * K + ranks[:, None] * K + ks[None, :],
                     mask=(ranks[:, None] < R) & (ks[None, :] < K), other=0.0)
        h += tl.sum(av * xv[None, :], axis=1)
    bv = tl.load(b_ptr + s * R * N + ranks[:, None] * N + cols[None, :],
                 mask=(ranks[:, None] < R) & (cols[None, :] < N), other=0.0)
    out = tl.sum(h[:, None] * bv, axis=0)
    out = tl.where(used, out, 0.0)
    tl.store(out_ptr + row * N + cols, out, mask=cols < N)


def lora_delta(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor,
               splits: Sequence[int] = ()) -> torch.Tensor:
    rows, k = x.shape
    _, r, n = b.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    a, b, slots = a.float().contiguous(), b.float().contiguous(), slots.long().contiguous()
    out = torch.empty(rows, n, dtype=torch.float32, device=x.device)
    if rows and n:
        _lora_delta_kernel[(rows, triton.cdiv(n, BLOCK_N))](
            x, a, b, slots, out, x.stride(0), k, r, n,
            BLOCK_R=triton.next_power_of_2(r), BLOCK_K=BLOCK_K, BLOCK_N=BLOCK_N)
    return out
