"""Rotary position embedding reference (pure torch), HF rotate_half convention.

rotary_cos_sin(positions [T] long, inv_freq [D/2] fp32) -> (cos, sin), each [T, D/2] fp32
apply_rotary(x [T,n,D], cos [T,D/2], sin [T,D/2]) -> [T,n,D]
    out[..., :D/2] = x1*cos - x2*sin ; out[..., D/2:] = x2*cos + x1*sin
"""
from __future__ import annotations

import torch


def rotary_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = positions.to(torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :]
    return freqs.cos(), freqs.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    cos = cos.to(x.dtype)[:, None, :]
    sin = sin.to(x.dtype)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
