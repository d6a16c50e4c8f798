"""Weight-only int8 matmul in Triton: int8 weights are widened tile by tile in
registers, so global memory moves 1 byte per weight; sums in fp32; the
per-channel scale and the bias are applied once per output tile.

int8_linear(x [T,K] fp16/bf16/fp32, qweight [N,K] int8, scale [N], bias [N] | None) -> [T,N]
in x's dtype; leading dims of x beyond the last are flattened.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _int8_matmul_kernel(x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr, T, N, K,
                        x_s0, w_s0, out_s0,
                        HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, DOT_FP32: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_mask, col_mask = rows < T, cols < N
    x_tile = x_ptr + rows[:, None].to(tl.int64) * x_s0 + ks[None, :]
    w_tile = w_ptr + cols[None, :].to(tl.int64) * w_s0 + ks[:, None]        # [BLOCK_K, BLOCK_N]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = k0 + ks < K
        x = tl.load(x_tile + k0, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_tile + k0, mask=k_mask[:, None] & col_mask[None, :], other=0)
        # int8 is exact in fp16/bf16/fp32, so widening to x's dtype loses nothing
        # (via fp32: the interpreter mis-converts int8 straight to bf16).
        w = w.to(tl.float32).to(x.dtype)
        if DOT_FP32:
            # bf16 values are exact in fp32, and the sum is fp32 either way.
            acc = tl.dot(x.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
        elif IEEE:
            # fp32 asks for ieee rather than tf32, which would round x to 10 bits.
            acc = tl.dot(x, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc)
    acc = acc * tl.load(scale_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rows[:, None].to(tl.int64) * out_s0 + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


def int8_linear(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    n, k = qweight.shape
    if x.shape[-1] != k:
        raise ValueError(f"int8_linear: x has {x.shape[-1]} features, qweight expects {k}")
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    w = qweight if qweight.stride(-1) == 1 else qweight.contiguous()
    t = x2.shape[0]
    out = torch.empty((t, n), dtype=x.dtype, device=x.device)
    # tl.dot wants tiles of at least 16; decode (t of 1..16) pads rows to one 16-row tile
    # and takes narrower column tiles so that N=4096 still spreads over >100 SMs.
    if t <= 16:
        block_m, block_n, block_k = 16, 32, 128
    else:
        block_m, block_n, block_k = 64, 64, 64
    if t and n:
        grid = (triton.cdiv(t, block_m), triton.cdiv(n, block_n))
        _int8_matmul_kernel[grid](
            x2, w, scale.contiguous(), bias.contiguous() if bias is not None else scale, out, t, n, k,
            x2.stride(0), w.stride(0), out.stride(0),
            HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32,
            # The interpreter (CPU tensors) has no bf16 dot; on CUDA it runs on tensor cores.
            DOT_FP32=x.dtype == torch.bfloat16 and x.device.type != "cuda",
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return out.reshape(*x.shape[:-1], n)
