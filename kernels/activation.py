"""Gated activation references (pure torch): the MLP's fused gate_up projection -> its input
to down_proj. x is [T, 2I], gate rows first, as loaded.

silu_and_mul(x [T, 2I]) -> [T, I]: silu(x[:, :I]) * x[:, I:]                     (SwiGLU)
gelu_and_mul(x [T, 2I]) -> [T, I]: gelu_tanh(x[:, :I]) * x[:, I:]                (GeGLU, Gemma)
    gelu_tanh is GELU's tanh approximation, transformers' "gelu_pytorch_tanh".
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up
