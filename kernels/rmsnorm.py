"""RMSNorm reference (pure torch), computed in fp32 as transformers does.

rms_norm(x [T,H], weight [H], eps) -> [T,H]
fused_add_rms_norm(x [T,H], residual [T,H], weight [H], eps) -> (normed [T,H], residual_out [T,H])
    residual_out = x + residual; normed = rms_norm(residual_out)
"""
from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    residual_out = residual + x
    return rms_norm(residual_out, weight, eps), residual_out
