"""SwiGLU's gate in Triton: out = silu(x[:, :I]) * x[:, I:]; one program per (row, column block).

silu_and_mul(x [T, 2I]) -> [T, I]   (kernels/activation.py is the reference)

The gate and up halves are read once and combined in fp32, then rounded once to x's
dtype (the reference rounds silu's output first, so bf16/fp16 can differ by an ulp).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, x_s0, out_s0, WIDTH, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < WIDTH
    gate = tl.load(x_ptr + row * x_s0 + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_s0 + WIDTH + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * out_s0 + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    rows, width = x.shape[0], x.shape[1] // 2
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(rows, width, dtype=x.dtype, device=x.device)
    if rows and width:
        _silu_and_mul_kernel[(rows, triton.cdiv(width, BLOCK))](
            x, out, x.stride(0), out.stride(0), width, BLOCK=BLOCK)
    return out
