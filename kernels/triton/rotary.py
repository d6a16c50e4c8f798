"""Rotary embedding in Triton (HF rotate_half convention); one program per (token, head).

apply_rotary(x [T,n,D], cos [T,D/2], sin [T,D/2]) -> [T,n,D]
    out[..., :D/2] = x1*cos - x2*sin ; out[..., D/2:] = x2*cos + x1*sin

Each half-row pair is read once and rotated in fp32, then rounded once to x's
dtype (the reference rounds after each op in x's dtype, so bf16/fp16 results
can differ from it by an ulp). D/2 need not be a power of two.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotary_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr,
                   x_s0, x_s1, cos_s0, sin_s0, out_s0, out_s1,
                   HALF: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < HALF
    row = x_ptr + t * x_s0 + h * x_s1
    # The reference casts cos/sin to x's dtype first; do the same so fp16/bf16 match it.
    cos = tl.load(cos_ptr + t * cos_s0 + cols, mask=mask, other=0.0).to(x_ptr.dtype.element_ty).to(tl.float32)
    sin = tl.load(sin_ptr + t * sin_s0 + cols, mask=mask, other=0.0).to(x_ptr.dtype.element_ty).to(tl.float32)
    x1 = tl.load(row + cols, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(row + HALF + cols, mask=mask, other=0.0).to(tl.float32)
    dst = out_ptr + t * out_s0 + h * out_s1
    out_ty = out_ptr.dtype.element_ty
    tl.store(dst + cols, (x1 * cos - x2 * sin).to(out_ty), mask=mask)
    tl.store(dst + HALF + cols, (x2 * cos + x1 * sin).to(out_ty), mask=mask)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [T, n, D], cos/sin: [T, D/2]
    tokens, heads, dim = x.shape
    if dim % 2:
        raise ValueError(f"apply_rotary: head_dim must be even, got {dim}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if tokens and heads:
        _rotary_kernel[(tokens, heads)](
            x, cos, sin, out, x.stride(0), x.stride(1), cos.stride(0), sin.stride(0),
            out.stride(0), out.stride(1), HALF=dim // 2, BLOCK=triton.next_power_of_2(dim // 2))
    return out
