"""SmoothQuant-style smoothing of int8 layers for W8A8, folded into the weights at load.

W8A8 quantizes each token's activations over its own range (kernels/int8.py). A few input
channels of q/k/v and gate/up carry values 10-20x their row's rms in every token, and
scaled by them the other channels keep 3 or 4 bits. Without smoothing, the kernels keep
16 such channels in fp32 (LLM.int8()'s split), a pass that costs about as much as the
int8 GEMM itself. SmoothQuant (Xiao et al., 2023) moves the outliers into the weights
instead: per input channel j of a linear layer,

    s_j = max|X_j| ** alpha / max|W_:,j| ** (1 - alpha),   X / s  and  W * s,

which leaves X @ W.T unchanged in exact arithmetic, and nothing stays in fp32. max|X_j|
comes from a calibration forward at load (`Calibration`, in the model's own float weights)
over CALIBRATION_TOKENS random token ids: no data is at hand in a loader, and on SmolLM2
random ids calibrate as well as text (benchmarks/smoothquant_probe.py).

X / s costs nothing at run time: it is folded into what produces X (`fold`):
    q/k/v    X = rms_norm(h) * attn_norm        -> attn_norm / s
    gate/up  X = rms_norm(h) * mlp_norm         -> mlp_norm / s
    down     X = act(gate) * up                 -> the up rows / s
    o        X = softmax(q k^T) v, per head     -> the v rows (and bias) / s, one s per
             kv head's channel, shared by the query heads of its group
Each fold is exact in real arithmetic; only the int8 rounding of W * s differs.
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

ALPHA = 0.7                   # migration strength: benchmarks/smoothquant_probe.py
CALIBRATION_TOKENS = 1024
CALIBRATION_SEED = 0
CALIBRATION_WINDOW = 256        # tokens per calibration prefill
FLOOR = 1e-5                  # keeps s finite for channels never seen or all-zero
VERSION = 2                   # of the calibration and the fold: a change re-packs cached layers


@dataclass(frozen=True)
class Heads:
    """The attention shape `fold` needs for o's input channels."""
    num_heads: int
    num_kv_heads: int
    head_dim: int


def identity() -> dict:
    """What the packed-layer cache key needs to know about the smoothing."""
    return {"version": VERSION, "alpha": ALPHA, "tokens": CALIBRATION_TOKENS, "seed": CALIBRATION_SEED,
            "window": CALIBRATION_WINDOW, "floor": FLOOR}


def calibration_ids(vocab_size: int) -> list[int]:
    """CALIBRATION_TOKENS token ids drawn with a fixed seed (ids below 5 are special on
    most tokenizers and skipped): the same for every load of a model."""
    rng = random.Random(CALIBRATION_SEED)
    return [rng.randrange(min(5, vocab_size - 1), vocab_size) for _ in range(CALIBRATION_TOKENS)]


class Calibration:
    """A linear kernel (the KernelSet's `linear` signature) over unpacked float weights that
    records, per weight, max|x| of each input channel over every call. It computes
    through `pack` and `linear` (default: plain torch), packing the weight at each call
    and keeping no packed copy (the engine's calibration uses each weight once): the engine
    passes its own, bf16 GEMMs where the CPU has them (the maxima need no more precision,
    and the forward is most of the calibration's time)."""

    def __init__(self, pack: Callable[[torch.Tensor], torch.Tensor] = lambda w: w,
                 linear: Callable[..., torch.Tensor] = F.linear) -> None:
        self.amax: dict[int, torch.Tensor] = {}    # id(weight) -> [K]
        self._pack, self._linear = pack, linear

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        seen = x.detach().reshape(-1, x.shape[-1]).abs().amax(dim=0).float()
        key = id(weight)
        self.amax[key] = seen if key not in self.amax else torch.maximum(self.amax[key], seen)
        return self._linear(x, self._pack(weight), bias)

    def of(self, weight: torch.Tensor) -> torch.Tensor:
        """max|x| per input channel of `weight`'s layer (zeros if it never ran)."""
        return self.amax.get(id(weight), torch.zeros(weight.shape[1]))


def factors(amax: torch.Tensor, wmax: torch.Tensor, alpha: float = ALPHA) -> torch.Tensor:
    """amax: [K] max|X_j|, wmax: [K] max|W_:,j| -> s [K] (float32)."""
    return (amax.float().clamp_min(FLOOR) ** alpha / wmax.float().clamp_min(FLOOR) ** (1 - alpha)).clamp_min(FLOOR)


def fold(layer, calibration: Calibration, heads: Heads, alpha: float = ALPHA):
    """A copy of a dense float LayerWeights (runtime/models/decoder.py) with the smoothing
    of its four matmuls folded in (this module's docstring). The matmuls come back in
    float32, to be quantized next; the norms and the bias keep their dtype."""
    qkv, o, gate_up, down = (w.float() for w in (layer.qkv, layer.o, layer.gate_up, layer.down))
    attn_norm, s_qkv = _divided(layer.attn_norm, factors(calibration.of(layer.qkv), _column_max(qkv), alpha))
    mlp_norm, s_mlp = _divided(layer.mlp_norm, factors(calibration.of(layer.gate_up), _column_max(gate_up), alpha))
    s_down = factors(calibration.of(layer.down), _column_max(down), alpha)
    # one v channel feeds every query head of its group: the maxima over the group
    group = heads.num_heads // heads.num_kv_heads

    def per_kv(v: torch.Tensor) -> torch.Tensor:        # [nh * D] -> [nkv * D]
        return v.view(heads.num_kv_heads, group, heads.head_dim).amax(dim=1).reshape(-1)
    s_kv = factors(per_kv(calibration.of(layer.o).float()), per_kv(_column_max(o)), alpha)
    s_o = s_kv.view(heads.num_kv_heads, 1, heads.head_dim).expand(-1, group, -1).reshape(-1)
    v_rows = slice((heads.num_heads + heads.num_kv_heads) * heads.head_dim, None)
    up_rows = slice(gate_up.shape[0] // 2, None)
    qkv = qkv * s_qkv[None, :]
    qkv[v_rows] /= s_kv[:, None]
    gate_up = gate_up * s_mlp[None, :]
    gate_up[up_rows] /= s_down[:, None]
    bias = layer.qkv_bias
    if bias is not None:
        smoothed = bias.float().clone()
        smoothed[v_rows] /= s_kv
        bias = smoothed.to(bias.dtype)
    return dataclasses.replace(layer, qkv=qkv, o=o * s_o[None, :], gate_up=gate_up, down=down * s_down[None, :],
                               qkv_bias=bias, attn_norm=attn_norm, mlp_norm=mlp_norm)


def _column_max(w: torch.Tensor) -> torch.Tensor:
    return w.abs().amax(dim=0)


def _divided(norm: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm / s in norm's dtype, the factor that division really applied): a bf16 norm
    rounds norm / s, and the weight must be scaled by what the norm was, not by s."""
    divided = (norm.float() / s).to(norm.dtype)
    applied = torch.where(divided != 0, norm.float() / divided.float(), s)
    return divided, applied
