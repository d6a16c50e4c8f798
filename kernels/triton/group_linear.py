"""Group-wise quantized linear (W4A16, W8A16) in Triton, for kernels/group_quant.py's layout.

group_linear(x [..., K] fp16/bf16/fp32, w: GroupQuantized [N, K], bias [N] | None) -> [..., N]
in x's dtype, sums in fp32; w.input_order is applied to x before the kernel.

Codes are never widened into a weight: each K step of a program lies inside one group, so
the tile's codes (0..15, or -128..127: exact in fp16, bf16 and fp32) go into tl.dot as
they are, and the group's scale and offset are applied to the fp32 product,

    out[m, n] += scale[n, g] * sum_k x[m, k] code[n, k] + offset[n, g] * sum_k x[m, k],

which is the definition (group_quant.linear_ref) up to fp32 summation order, in every
dtype: a kernel that dequantized into x's dtype would round each weight first. A 4-bit
tile is one load of its bytes, whose low nibbles are values j and high nibbles values
j + 16 of each 32-value block: two dots, each against the matching columns of x.

Decode (a few rows) is bandwidth-bound: narrow column tiles, and K split over several
programs while the tiles are too few to occupy the GPU, each writing an fp32 partial that
torch sums in a fixed order (deterministic). Prefill takes wider tiles on the tensor cores
and no split.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from kernels import group_quant
from kernels.group_quant import GroupQuantized

MAX_BLOCK_K = 128            # the K step: the largest power of two dividing the group, up to this
DECODE_ROWS = 16             # up to this many rows: the decode tiles
SPLIT_PROGRAMS = 512         # K is split until about this many programs run (a few per SM)


@triton.jit
def _group_linear_kernel(x_ptr, codes_ptr, scales_ptr, offsets_ptr, scale_super_ptr, offset_super_ptr,
                         bias_ptr, out_ptr, M, N, K, k_per_split,
                         x_s0, codes_s0, scales_s0, offsets_s0, scale_super_s0, offset_super_s0,
                         out_s0, out_split_s,
                         BITS: tl.constexpr, GROUP: tl.constexpr, SUPER_EVERY: tl.constexpr,
                         HAS_OFFSETS: tl.constexpr, HAS_SCALE_SUPER: tl.constexpr,
                         HAS_OFFSET_SUPER: tl.constexpr, HAS_BIAS: tl.constexpr,
                         IEEE: tl.constexpr, DOT_FP32: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(2)
    row_mask, col_mask = rows < M, cols < N
    x_rows = x_ptr + rows[:, None].to(tl.int64) * x_s0
    cols64 = cols.to(tl.int64)
    if BITS == 4:
        # byte i of the tile: values (i // 16) * 32 + i % 16 (low nibble) and that + 16 (high)
        i = tl.arange(0, BLOCK_K // 2)
        x_lo = x_rows + ((i // 16) * 32 + i % 16)[None, :]
        w_tile = codes_ptr + cols64[None, :] * codes_s0 + i[:, None]              # [BLOCK_K/2, BLOCK_N]
    else:
        ks = tl.arange(0, BLOCK_K)
        x_lo = x_rows + ks[None, :]
        w_tile = codes_ptr + cols64[None, :] * codes_s0 + ks[:, None]             # [BLOCK_K, BLOCK_N]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_start = split * k_per_split
    # K is a whole number of groups and BLOCK_K divides the group: no K mask
    for k0 in range(k_start, tl.minimum(k_start + k_per_split, K), BLOCK_K):
        x_mask = row_mask[:, None]
        w_mask = col_mask[None, :]
        if BITS == 4:
            packed = tl.load(w_tile + k0 // 2, mask=w_mask, other=0)
            xa = tl.load(x_lo + k0, mask=x_mask, other=0.0)
            xb = tl.load(x_lo + (k0 + 16), mask=x_mask, other=0.0)
            part = _dot(xa, packed & 0x0F, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), IEEE, DOT_FP32)
            part = _dot(xb, packed >> 4, part, IEEE, DOT_FP32)
            if HAS_OFFSETS:
                x_sum = tl.sum(xa.to(tl.float32), axis=1) + tl.sum(xb.to(tl.float32), axis=1)
        else:
            codes = tl.load(w_tile + k0, mask=w_mask, other=0)
            xa = tl.load(x_lo + k0, mask=x_mask, other=0.0)
            part = _dot(xa, codes, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), IEEE, DOT_FP32)
            if HAS_OFFSETS:
                x_sum = tl.sum(xa.to(tl.float32), axis=1)
        g = k0 // GROUP
        scale = tl.load(scales_ptr + cols64 * scales_s0 + g, mask=col_mask, other=0.0).to(tl.float32)
        if HAS_SCALE_SUPER:
            scale *= tl.load(scale_super_ptr + cols64 * scale_super_s0 + g // SUPER_EVERY,
                             mask=col_mask, other=0.0).to(tl.float32)
        acc += part * scale[None, :]
        if HAS_OFFSETS:
            offset = tl.load(offsets_ptr + cols64 * offsets_s0 + g, mask=col_mask, other=0.0).to(tl.float32)
            if HAS_OFFSET_SUPER:
                offset *= tl.load(offset_super_ptr + cols64 * offset_super_s0 + g // SUPER_EVERY,
                                  mask=col_mask, other=0.0).to(tl.float32)
            acc += x_sum[:, None] * offset[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + split.to(tl.int64) * out_split_s + rows[:, None].to(tl.int64) * out_s0 + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


@triton.jit
def _dot(x, codes, acc, IEEE: tl.constexpr, DOT_FP32: tl.constexpr):
    # codes are exact in x's dtype (via fp32: the interpreter mis-converts ints to bf16)
    w = codes.to(tl.float32).to(x.dtype)
    if DOT_FP32:
        # bf16 values are exact in fp32, and the sum is fp32 either way
        return tl.dot(x.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
    elif IEEE:
        # fp32 asks for ieee rather than tf32, which would round x to 10 bits
        return tl.dot(x, w, acc, input_precision="ieee")
    else:
        return tl.dot(x, w, acc)


def block_k(w: GroupQuantized) -> int:
    """The K step: within one group, at least 16 (tl.dot's least) and a whole 4-bit block."""
    step = min(w.group & -w.group, MAX_BLOCK_K)
    if step < 16:
        raise ValueError(f"group_linear: group {w.group} is not a multiple of 16")
    return step


def tiles(rows: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): decode pads its rows to one 16-row tile (tl.dot's least) and
    takes narrow column tiles, so that a few rows still spread over every SM."""
    return (16, 32) if rows <= DECODE_ROWS else (64, 64)


def k_splits(rows: int, n: int, k: int, step: int, bits: int) -> int:
    """How many programs share each tile's K: few rows make few tiles, which would leave
    most SMs idle. Never more than the K steps there are, nor so many that the fp32
    partials (splits x rows x n x 4 bytes) outweigh half the codes they save reading
    serially: prefill runs unsplit."""
    block_m, block_n = tiles(rows)
    steps = k // step
    wanted = triton.cdiv(SPLIT_PROGRAMS, triton.cdiv(rows, block_m) * triton.cdiv(n, block_n))
    per_split = triton.cdiv(steps, max(1, min(steps, wanted, k * bits // (64 * rows))))
    return triton.cdiv(steps, per_split)


def group_linear(x: torch.Tensor, w: GroupQuantized, bias: Optional[torch.Tensor] = None,
                 splits: Optional[int] = None) -> torch.Tensor:
    """splits: the K split (default k_splits'; tests choose theirs)."""
    n, k = w.shape
    if x.shape[-1] != k:
        raise ValueError(f"group_linear: x has {x.shape[-1]} features, the weight expects {k}")
    x2 = group_quant.order_input(x.reshape(-1, k), w)
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    m, step = x2.shape[0], block_k(w)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out.reshape(*x.shape[:-1], n)
    block_m, block_n = tiles(m)
    split = k_splits(m, n, k, step, w.bits) if splits is None else splits
    per_split = triton.cdiv(k // step, split) * step
    split = triton.cdiv(k, per_split)
    partial = out if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    codes = _rows_contiguous(w.codes)
    # an absent level passes the codes in its place: its flag keeps the kernel off it
    per_group = [codes if t is None else _rows_contiguous(t)
                 for t in (w.scales, w.offsets, w.scale_super, w.offset_super)]
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), split)
    _group_linear_kernel[grid](
        x2, codes, *per_group, codes if bias is None else bias, partial, m, n, k, per_split,
        x2.stride(0), codes.stride(0), *(t.stride(0) for t in per_group), partial.stride(-2),
        partial.stride(0) if split > 1 else 0,
        BITS=w.bits, GROUP=w.group, SUPER_EVERY=w.super_every,
        HAS_OFFSETS=w.offsets is not None, HAS_SCALE_SUPER=w.scale_super is not None,
        HAS_OFFSET_SUPER=w.offset_super is not None, HAS_BIAS=bias is not None and split == 1,
        IEEE=x.dtype == torch.float32,
        # The interpreter (CPU tensors) has no bf16 dot; on CUDA it runs on tensor cores.
        DOT_FP32=x.dtype == torch.bfloat16 and x.device.type != "cuda",
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=step)
    if split > 1:
        summed = partial.sum(dim=0)
        if bias is not None:
            summed += bias.float()
        out = summed.to(x.dtype)
    return out.reshape(*x.shape[:-1], n)


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()
