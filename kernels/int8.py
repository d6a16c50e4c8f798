"""Weight-only int8: symmetric per-output-channel quantization, pure torch.

A weight `w: [N, K]` (N output channels) is stored as `qweight: [N, K] int8`
and `scale: [N] float32` with `w ≈ qweight * scale[:, None]`. Activations stay
in their own dtype; only the weights shrink (4x vs fp32, 2x vs bf16).

W8A8 (w8a8_linear_ref) quantizes the activations too, at run time, each token (row of
x) over its own [min, max] in 255 steps with a zero point (quantize_per_token), so that
the GEMM itself runs on int8 x int8 -> int32 (kernels/cpu/w8a8_linear.py, on CPUs with
int8 dot products). Asymmetric because down_proj's input (silu(gate) * up) is skewed:
symmetric per-token steps cost SmolLM2 +0.67% perplexity in down_proj alone, asymmetric
+0.23%, and +1.14% -> +0.94% over the whole model (8192 held-out tokens). A few input channels
carry outliers in every token (the inputs of q/k/v and gate/up have values 10-20x
their row's rms in the same 4 or so channels of SmolLM2): scaled by them, the other
channels would keep 3 or 4 bits. So the W8A8_OUTLIERS channels with the largest
max|x| over the call's rows stay in fp32 against their int8 weights (LLM.int8()'s
decomposition, with a fixed count so that its cost is bounded: 16 of K >= 576 columns).
The engine smooths int8 weights at load instead where it runs W8A8 (runtime/load/smoothing.py:
the outliers folded into the weights, SmoothQuant-style) and calls W8A8 with outliers=0.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w: [N, K] float -> (qweight [N, K] int8, scale [N] float32)."""
    w = w.float()
    amax = w.abs().amax(dim=1)
    # An all-zero row would give scale 0 and 0/0 = nan; scale 1 quantizes it to zeros.
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize(qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """qweight: [N, K] int8, scale: [N] -> [N, K] float32."""
    return qweight.float() * scale.float()[:, None]


def int8_linear_ref(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """The definition: x @ dequantize(qweight, scale).T in fp32, cast to x's dtype."""
    # x: [T, K], qweight: [N, K], scale: [N], bias: [N] -> [T, N]
    out = x.float() @ dequantize(qweight, scale).T
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


# input channels kept in fp32 by W8A8 (see above); 0 quantizes every channel
W8A8_OUTLIERS = 16


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x: [T, K] float -> (xq [T, K] int8, scale [T] float32, zero [T] int32) with
    x ≈ (xq - zero[:, None]) * scale[:, None].

    Each token its own steps, so one outlier token does not coarsen the others: its
    [min, max] (widened to hold 0, so that a zero, such as a channel set apart, stays
    exactly zero: it quantizes to `zero`) in 255 steps."""
    x = x.float()
    lo, hi = x.amin(dim=1).clamp(max=0), x.amax(dim=1).clamp(min=0)
    step = (hi - lo) / 255
    # An all-zero token would give step 0 and 0/0 = nan; step 1 quantizes it to zeros.
    scale = torch.where(step > 0, step, torch.ones_like(step))
    zero = torch.round(-lo / scale) - 128                     # in [-128, 127]: lo maps to -128
    # times the reciprocal, as kernels/cpu/w8a8_quant.c does (a product per value is cheaper
    # than a division), so that both give the same integers
    xq = (torch.round(x * (1 / scale)[:, None]) + zero[:, None]).clamp_(-128, 127).to(torch.int8)
    return xq, scale, zero.to(torch.int32)


def outlier_channels(x: torch.Tensor, count: int) -> torch.Tensor:
    """x: [T, K] -> the indices of the `count` channels with the largest max|x| over T
    (all of them when K <= count; none when T is 0)."""
    if x.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=x.device)
    return x.abs().amax(dim=0).topk(min(count, x.shape[1])).indices


def split_outliers(x: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x: [T, K] -> (inliers [T, K] fp32 with the outlier channels zeroed, outliers [T, C]
    fp32, their channel indices [C])."""
    cols = outlier_channels(x, count)
    x32 = x.float()
    return x32.index_fill(1, cols, 0), x32[:, cols], cols


def w8a8_linear_ref(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                    bias: torch.Tensor | None = None, outliers: int = W8A8_OUTLIERS) -> torch.Tensor:
    """The W8A8 definition: x's `outliers` channels apart (split_outliers), the rest
    quantized per token with its zero point; the int8 products summed exactly (float64 holds any int8 dot
    product of K < 2^37 terms), the outlier channels times their int8 weights added, and
    the weight scale applied last. x: [T, K], qweight: [N, K] int8, scale: [N], bias: [N]
    -> [T, N] in x's dtype."""
    inliers, outlying, cols = split_outliers(x, outliers)
    xq, xscale, zero = quantize_per_token(inliers)
    acc = ((xq.double() - zero.double()[:, None]) @ qweight.double().T) * xscale.double()[:, None]
    acc = acc + outlying.double() @ qweight[:, cols].double().T
    out = acc * scale.double()[None, :]
    if bias is not None:
        out = out + bias.double()
    return out.to(x.dtype)


def int8_linear(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: [..., K], qweight: [N, K] int8, scale: [N], bias: [N] -> [..., N] in x's dtype.

    The fastest pure-torch form of `int8_linear_ref` on each device.
    """
    k = qweight.shape[1]
    x2 = x.reshape(-1, k)
    if _cpu_gemv_applies(x2, qweight):
        out = _int8_gemv_cpu(x2, qweight, scale)
    elif x.dtype == torch.float16:
        # x @ qweight.T can exceed fp16's 65504 before scaling, and small scales
        # are fp16 subnormals: dequantize in fp32, then narrow.
        out = F.linear(x2, dequantize(qweight, scale).to(x.dtype))
    else:
        # The per-channel scale scales output columns, so it commutes with the
        # matmul: scaling the [T, N] result avoids a dequantized [N, K] copy.
        out = F.linear(x2, qweight.to(x.dtype)) * scale.to(x.dtype)
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out.to(x.dtype).reshape(*x.shape[:-1], qweight.shape[0])


def _cpu_gemv_applies(x: torch.Tensor, qweight: torch.Tensor, max_rows: int = 16) -> bool:
    # torch's CPU int8 GEMV (the one gpt-fast uses) reads int8 straight from
    # memory, so a decode step moves 1 byte per weight instead of converting the
    # whole matrix first. It is fast only for few rows and for bf16 activations,
    # and in torch 2.13 it segfaults on K not a multiple of 16 once T > 1.
    return (x.device.type == "cpu" and 0 < x.shape[0] <= max_rows and qweight.shape[1] % 16 == 0
            and hasattr(torch, "_weight_int8pack_mm"))


def _int8_gemv_cpu(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x: [T, K] -> [T, N] float32.

    Activations pass through bf16 (about 0.25% relative error on the output,
    next to about 0.85% from the int8 weights themselves); the kernel sums in
    fp32, and the fp32 scale is applied afterwards rather than rounded to bf16.
    """
    ones = torch.ones(qweight.shape[0], dtype=torch.bfloat16)
    out = torch._weight_int8pack_mm(x.to(torch.bfloat16).contiguous(), qweight.contiguous(), ones)
    return torch.mul(out, scale.float())     # bf16 * fp32 -> fp32 in one op


class Int8Linear(nn.Module):
    """Drop-in for nn.Linear with int8 weights; only buffers, nothing trainable."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: torch.device | str | None = None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
        self.register_buffer("scale", torch.ones(out_features, dtype=torch.float32, device=device))
        self.register_buffer("bias", torch.zeros(out_features, device=device) if bias else None)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "Int8Linear":
        """weight: [N, K], bias: [N] (any float dtype; bias keeps its dtype)."""
        n, k = weight.shape
        mod = cls(k, n, bias=bias is not None, device=weight.device)
        mod.qweight, mod.scale = quantize_per_channel(weight.detach())
        if bias is not None:
            mod.bias = bias.detach().clone()
        return mod

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int8Linear":
        return cls.from_weight(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return int8_linear(x, self.qweight, self.scale, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
