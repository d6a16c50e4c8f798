"""Dense linear layer reference (pure torch), and the weight preparation it pairs with.

pack(weight [N,K]) -> what linear() takes for that weight; the reference keeps it as it is.
linear(x [...,K], weight, bias [N] or None) -> [...,N]: x @ weight.T + bias

A faster backend may store a packed weight in a layout of its own (kernels/cpu/linear.py),
so a model hands its linear weights through pack() once, at load, and to linear() after.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def pack(weight: torch.Tensor) -> torch.Tensor:
    return weight


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    return F.linear(x, weight, bias)
