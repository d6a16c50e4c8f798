"""W4A8: group-wise 4-bit weights (kernels/group_quant.py) times int8 activations, pure torch.

The definition the CPU kernel (kernels/cpu/group_linear.py:w4a8_linear) is tested against.
Each token (row of x) is quantized at run time to int8 with one symmetric scale, its
max|x| over 127 steps (quantize_per_token_symmetric); each group's dot product of those
int8 values with the weight's integer codes is then exact, and it meets the group's
scale and offset in float, as llama.cpp's Q4 x Q8 dot products do:

    out[t, n] = xscale[t] * sum_g (scale[n, g] * sum_{k in g} xq[t, k] code[n, k]
                                   + offset[n, g] * sum_{k in g} xq[t, k])

Symmetric, unlike W8A8's per-token steps with a zero point (kernels/int8.py): a zero
point would add a per-group sum of codes to every group's dot product.
"""
from __future__ import annotations

from typing import Optional

import torch

from kernels import group_quant
from kernels.group_quant import GroupQuantized

# the float32 nearest 1/127 (the C kernel multiplies by it; a division by 127 compiled
# with -ffast-math is that product)
_INV_127 = torch.tensor(1 / 127, dtype=torch.float32)


def quantize_per_token_symmetric(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [T, K] float -> (xq [T, K] int8 in -127..127, scale [T] float32), x ≈ xq * scale."""
    x = x.float()
    amax = x.abs().amax(dim=1)
    # an all-zero token would give scale 0 and 0/0 = nan; scale 1 quantizes it to zeros
    scale = torch.where(amax > 0, amax * _INV_127, torch.ones_like(amax))
    # times the reciprocal, as the C kernel does, so that both give the same integers
    xq = torch.round(x * (1 / scale)[:, None]).clamp_(-127, 127).to(torch.int8)
    return xq, scale


def w4a8_linear_ref(x: torch.Tensor, w: GroupQuantized, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The definition above in float64 (each group's integer sums exact), + bias, cast to
    x's dtype. x: [..., K] -> [..., N]; any bits (the 8-bit codes are integers too)."""
    n, k = w.shape
    groups = k // w.group
    x2 = group_quant.order_input(x.reshape(-1, k).float(), w)
    xq, xscale = quantize_per_token_symmetric(x2)
    xg = xq.double().reshape(-1, groups, w.group)
    dots = torch.einsum("tgk,ngk->tng", xg, group_quant.unpack_codes(w).double().reshape(n, groups, w.group))
    out = (dots * group_quant.group_scales(w).double()).sum(-1)
    offsets = group_quant.group_offsets(w)
    if offsets is not None:
        out = out + xg.sum(-1) @ offsets.double().T
    out = out * xscale.double()[:, None]
    if bias is not None:
        out = out + bias.double()
    return out.to(x.dtype).reshape(*x.shape[:-1], n)
