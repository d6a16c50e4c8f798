"""SwiGLU activation reference (pure torch).

silu_and_mul(x [T, 2I]) -> [T, I]: silu(x[:, :I]) * x[:, I:]
    x is the output of the fused gate_up projection (gate rows first, as loaded).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
