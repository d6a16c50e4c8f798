"""AWQ (Lin et al., 2023): a scale per input channel, searched on calibration activations,
that grows the weights which meet large activations before they are rounded, folded
into what produces those activations so that the float model is unchanged.

Follows AutoAWQ (awq/quantize/quantizer.py: _search_best_scale, apply_scale,
_compute_best_clip; llm-awq's auto_scale.py and auto_clip.py before it), layer by layer
on the float layers' own outputs as AutoAWQ runs:
- for each group of linears reading one input X: s = mean|X|^r / (mean|W~|^(1-r) + 1e-4)
  (W~: |W| over its group's max; "duo scaling", AutoAWQ's default; without it
  s = mean|X|^r), clamped to 1e-4 and divided by sqrt(max(s) min(s)), for r on a grid
  of N_GRID; the s whose pseudo-quantized Q(W * s) / s moves the output of the block
  they feed least (mean squared error) wins. The blocks: q/k/v -> the attention block
  (folded into input_layernorm), gate/up -> the MLP (post_attention_layernorm), down ->
  itself (folded into up's rows), o -> itself (into v's rows) only where v's and o's
  shapes agree (not under grouped-query attention), as AutoAWQ does;
- optional clipping: per output channel and group, the largest |w| kept is shrunk by
  steps of 1/N_GRID down to MAX_SHRINK of it, the one whose rounding moves that group's
  partial output least over CLIP_TOKENS calibration rows kept (not for q and k);
- then round-to-nearest on each group's own [min, max] (AWQ's zero point, 0..15).
"""
from __future__ import annotations

import logging
from typing import Callable

import torch
import torch.nn.functional as F

from runtime.quantize.groups import QuantizedLinear, minmax_grid, round_to_nearest
from runtime.quantize.layers import SITES, FloatModel, Layer, LayerRunner, layer_prefix, weight_name

N_GRID = 20
MAX_SHRINK = 0.5
CLIP_TOKENS = 512
SKIP_CLIP = ("q_proj", "k_proj")          # AutoAWQ: their errors pass through softmax, not summed
NAME = "awq"
log = logging.getLogger(__name__)
Inspect = Callable[[list[torch.Tensor]], torch.Tensor]


def pseudo_quantize(w: torch.Tensor, group: int) -> torch.Tensor:
    """w [N, K] rounded on AWQ's grids (each group's own [min, max]), as float32."""
    rows = w.float().reshape(-1, group)
    return minmax_grid(rows, include_zero=False).rounded(rows).reshape(w.shape)


def search_scale(x: torch.Tensor, weights: list[torch.Tensor], inspect: Inspect, group: int,
                 duo: bool = True) -> torch.Tensor:
    """The best scale [K] for the linears `weights` (each [N_i, K]) reading x [T, K];
    inspect(weights) is the output of the block they feed."""
    x_mean = x.abs().reshape(-1, x.shape[-1]).float().mean(0)
    both = torch.cat(weights).float()
    normed = both.abs().reshape(-1, group)
    w_mean = (normed / (normed.amax(dim=1, keepdim=True) + 1e-6)).reshape(both.shape).mean(0)
    reference = inspect(weights)
    best, best_loss = torch.ones_like(x_mean), float("inf")
    for step in range(N_GRID):
        ratio = step / N_GRID
        s = (x_mean.pow(ratio) / (w_mean.pow(1 - ratio) + 1e-4)) if duo else x_mean.pow(ratio)
        s = s.clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        s[~torch.isfinite(s)] = 1
        trial = [pseudo_quantize(w * s, group) / s for w in weights]
        loss = (reference - inspect(trial)).float().pow(2).mean().item()
        if loss < best_loss:
            best, best_loss = s, loss
    return best


def fold(layer: Layer, scales: dict[str, torch.Tensor]) -> Layer:
    """A copy of the layer with each site's scale s folded in: the linears reading the
    site's input times s along their input channels, what produces the input divided by
    s (a norm's weight, or the rows of v or up and their bias). Exact in real arithmetic."""
    out = dict(layer)

    def into_linears(site: str, s: torch.Tensor) -> None:
        for name in SITES[site]:
            out[weight_name(name)] = out[weight_name(name)] * s[None, :]

    def into_rows(name: str, s: torch.Tensor) -> None:
        w = weight_name(name)
        out[w] = out[w].clone()
        out[w][-s.shape[0]:] /= s[:, None]
        bias = w[:-len("weight")] + "bias"
        if bias in out:
            out[bias] = out[bias].clone()
            out[bias][-s.shape[0]:] /= s

    into_linears("qkv", scales["qkv"])
    out["input_layernorm.weight"] = layer["input_layernorm.weight"] / scales["qkv"]
    if "o" in scales:
        into_linears("o", scales["o"])
        into_rows("v_proj", scales["o"])
    into_linears("gate_up", scales["gate_up"])
    out["post_attention_layernorm.weight"] = layer["post_attention_layernorm.weight"] / scales["gate_up"]
    into_linears("down", scales["down"])
    into_rows("up_proj", scales["down"])
    return out


def layer_scales(runner: LayerRunner, layer: Layer, i: int, inputs: dict[str, torch.Tensor], group: int,
                 duo: bool = True) -> dict[str, torch.Tensor]:
    """Each site's searched scale, all on the float layer (AutoAWQ applies them together after)."""
    def linears(site: str) -> list[torch.Tensor]:
        return [layer[weight_name(n)] for n in SITES[site]]

    def replaced(site: str, ws: list[torch.Tensor]) -> Layer:
        return layer | {weight_name(n): w for n, w in zip(SITES[site], ws)}

    def alone(site: str) -> Inspect:
        return lambda ws: F.linear(inputs[site], ws[0])

    scales = {
        "qkv": search_scale(inputs["qkv"], linears("qkv"),
                            lambda ws: runner.attention(inputs["qkv"], replaced("qkv", ws), i), group, duo),
        "gate_up": search_scale(inputs["gate_up"], linears("gate_up"),
                                lambda ws: runner.mlp(inputs["gate_up"], replaced("gate_up", ws)), group, duo),
        "down": search_scale(inputs["down"], linears("down"), alone("down"), group, duo),
    }
    if layer[weight_name("v_proj")].shape == layer[weight_name("o_proj")].shape:
        scales["o"] = search_scale(inputs["o"], linears("o"), alone("o"), group, duo)
    return scales


def clip(w: torch.Tensor, x: torch.Tensor, group: int) -> torch.Tensor:
    """w [N, K] with each (row, group) clamped to the max |w| whose rounding moves that
    group's partial output on x [T, K] least."""
    n, k = w.shape
    x = x.reshape(-1, k)[::max(1, x.reshape(-1, k).shape[0] // CLIP_TOKENS)].float()
    xg = x.reshape(x.shape[0], k // group, group)                     # [t, G, g]
    wg = w.float().reshape(n, k // group, group)                      # [N, G, g]
    best_max = torch.empty(n, k // group, 1)
    batch = 256 if n % 256 == 0 else 64
    for b in range(0, n, batch):
        chunk = wg[b:b + batch]
        original_max = chunk.abs().amax(dim=-1, keepdim=True)         # [n, G, 1]
        original = torch.einsum("tgj,ngj->ngt", xg, chunk)
        best, errors = original_max.clone(), torch.full_like(original_max, float("inf"))
        for step in range(int(MAX_SHRINK * N_GRID)):
            limit = original_max * (1 - step / N_GRID)
            rounded = pseudo_quantize(torch.clamp(chunk, -limit, limit).reshape(-1, k), group).reshape(chunk.shape)
            err = (torch.einsum("tgj,ngj->ngt", xg, rounded) - original).pow(2).mean(dim=-1, keepdim=True)
            better = err < errors
            errors[better], best[better] = err[better], limit[better]
        best_max[b:b + batch] = best
    return torch.clamp(wg, -best_max, best_max).reshape(n, k)


def quantize_model(model: FloatModel, runner: LayerRunner, group: int, clipping: bool = True,
                   duo: bool = True) -> dict[str, QuantizedLinear]:
    """Every decoder linear of `model` by its name without `.weight`; the model's norms
    (and v's and up's rows, before rounding) take the folded scales in place, so its
    float tensors are what the quantized folder stores beside the linears."""
    out: dict[str, QuantizedLinear] = {}
    h = runner.embed(model)
    for i in range(model.config.num_hidden_layers):
        layer = model.layer(i)
        h_next, inputs = runner.forward(h, layer, i)
        scales = layer_scales(runner, layer, i, inputs, group, duo)
        layer = fold(layer, scales)
        for site, names in SITES.items():
            x = inputs[site] / scales[site] if site in scales else inputs[site]
            for name in names:
                w = layer[weight_name(name)]
                if clipping and name not in SKIP_CLIP:
                    w = clip(w, x, group)
                out[layer_prefix(i) + weight_name(name)[:-len(".weight")]] = \
                    round_to_nearest(w, group, include_zero=False)
        model.set_layer(i, layer)
        h = h_next
        log.info("%s: layer %d of %d quantized", NAME, i + 1, model.config.num_hidden_layers)
    return out
