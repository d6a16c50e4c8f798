"""RMSNorm in Triton, optionally fused with the residual add; one program per row.

rms_norm(x [T,H], weight [H], eps) -> [T,H]
fused_add_rms_norm(x [T,H], residual [T,H], weight [H], eps) -> (normed [T,H], residual_out [T,H])

Same rounding as kernels/rmsnorm.py: the sum of squares in fp32, the normalized
row cast to x's dtype before the weight multiplies it (as transformers does).
Leading dims beyond the last are flattened; the hidden size fits one block.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
                     x_stride, res_stride, out_stride, res_out_stride, H, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK_H: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    # Arithmetic is in fp32 with a rounding wherever torch rounds (fp16/bf16 ops
    # in torch are fp32 ops rounded); the interpreter cannot do bf16 arithmetic.
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * res_out_stride + cols, x, mask=mask)
    h = x.to(tl.float32)
    h = h * tl.rsqrt(tl.sum(h * h, axis=0) / H + eps)
    h = h.to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, (w * h).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _launch(x, None, weight, eps)[0]


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch(x, residual, weight, eps)


def _launch(x, residual, weight, eps):
    """-> (normed, residual_out), residual_out None without a residual."""
    shape, hidden = x.shape, x.shape[-1]
    x2 = _rows(x)
    res2 = _rows(residual) if residual is not None else x2
    res_dtype = torch.promote_types(x.dtype, residual.dtype) if residual is not None else x.dtype
    res_out = torch.empty(x2.shape, dtype=res_dtype, device=x.device) if residual is not None else x2
    # weight * h with h in residual_out's (or x's) dtype, so the output dtype promotes like torch.
    out = torch.empty(x2.shape, dtype=torch.promote_types(weight.dtype, res_dtype), device=x.device)
    block = triton.next_power_of_2(hidden)
    if x2.shape[0] > 0:
        _rms_norm_kernel[(x2.shape[0],)](
            x2, res2, weight.contiguous(), out, res_out,
            x2.stride(0), res2.stride(0), out.stride(0), res_out.stride(0), hidden, eps,
            HAS_RESIDUAL=residual is not None, BLOCK_H=block,
            # One row per program: wide rows need more warps to keep loads in flight.
            num_warps=min(16, max(4, block // 512)))
    return out.view(shape), (res_out.view(shape) if residual is not None else None)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[..., H] -> [rows, H] with unit stride along H (the kernel's only layout demand)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()
