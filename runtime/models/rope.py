"""Rotary position embeddings as the checkpoints define them.

Inverse frequencies are computed exactly as transformers computes them (default, linear,
llama3, longrope). A Rotary may turn only the first rotary_dim dims of each head (the
partial rotary of Phi-4-mini) and scale cos and sin by an attention factor (LongRoPE).

LongRoPE has two sets of factors: short ones for contexts up to the checkpoint's
original_max_position_embeddings and long ones beyond. transformers picks a set per
forward pass from the sequence's length and recomputes the whole KV cache when a
sequence crosses over; a paged cache whose blocks sequences share cannot be rotated
twice, so here the set is fixed per replica by its context (max_model_len): long iff that
exceeds the original context, as vLLM does. A replica whose context stays within the
original one matches transformers on every sequence; one beyond it matches transformers
on sequences longer than the original context.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch

from kernels.rotary import rotary_cos_sin
from runtime.core.config import ModelConfig


@dataclass(frozen=True, eq=False)
class Rotary:
    inv_freq: torch.Tensor                 # [rotary_dim / 2] fp32
    attention_factor: float = 1.0          # LongRoPE: cos and sin are scaled by it

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] -> (cos, sin), each [T, rotary_dim / 2] fp32."""
        cos, sin = rotary_cos_sin(positions, self.inv_freq)
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos, sin

    def apply(self, ops: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, n, D] -> [T, n, D], its first rotary_dim dims rotated (ops: a KernelSet)."""
        turned = 2 * cos.shape[-1]
        if turned == x.shape[-1]:
            return ops.apply_rotary(x, cos, sin)
        return torch.cat([ops.apply_rotary(x[..., :turned], cos, sin), x[..., turned:]], dim=-1)


def make_rotary(config: ModelConfig, device: str, context_len: Optional[int] = None,
                local: bool = False) -> Rotary:
    """The global layers' rotary; local=True: Gemma 3's sliding layers' (own base, unscaled)."""
    if local:
        assert config.local_rope_theta is not None
        return Rotary(_default(config.local_rope_theta, rotary_dim(config)).to(device))
    return Rotary(rope_inv_freq(config, context_len).to(device), attention_factor(config))


def rotary_dim(config: ModelConfig) -> int:
    return int(config.head_dim * config.partial_rotary_factor)


def rope_inv_freq(config: ModelConfig, context_len: Optional[int] = None) -> torch.Tensor:
    """[rotary_dim / 2] fp32, computed as transformers does (default, linear, llama3, longrope)."""
    inv = _default(config.rope_theta, rotary_dim(config))
    s = config.rope_scaling
    if s is None:
        return inv
    if s["rope_type"] == "linear":
        return inv / s["factor"]
    if s["rope_type"] == "longrope":
        long = context_len is not None and context_len > s["original_max_position_embeddings"]
        factors = torch.tensor(s["long_factor" if long else "short_factor"], dtype=torch.float32)
        return 1.0 / (factors * config.rope_theta ** _exponents(rotary_dim(config)))
    return _llama3(inv, s)


def attention_factor(config: ModelConfig) -> float:
    """LongRoPE's scale of cos and sin (1 for every other rope type)."""
    s = config.rope_scaling
    if s is None or s["rope_type"] != "longrope":
        return 1.0
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])
    original = s["original_max_position_embeddings"]
    factor = s.get("factor") or config.max_position_embeddings / original
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def _exponents(dim: int) -> torch.Tensor:
    return torch.arange(0, dim, 2, dtype=torch.int64).float() / dim


def _default(theta: float, dim: int) -> torch.Tensor:
    return 1.0 / (theta ** _exponents(dim))


def _llama3(inv: torch.Tensor, s: dict) -> torch.Tensor:
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)
