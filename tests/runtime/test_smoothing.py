"""runtime/load/smoothing.py: SmoothQuant-style smoothing folded into a layer's float weights.

Plain code over tensors: a small GQA layer in float64 (a reference written here, not the
engine's kernels) gives the same output with and without the fold, and the fold really
moves the activations' outliers into the weights."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from runtime.load import smoothing
from runtime.models.decoder import LayerWeights

HEADS = smoothing.Heads(num_heads=4, num_kv_heads=2, head_dim=8)
H, INTER, T = 32, 48, 6


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _layer(bias: bool) -> LayerWeights:
    nh, nkv, d = HEADS.num_heads, HEADS.num_kv_heads, HEADS.head_dim
    return LayerWeights(attn_norm=1 + _randn(H, seed=1).abs(), qkv=_randn((nh + 2 * nkv) * d, H, seed=2),
                        o=_randn(H, nh * d, seed=3), mlp_norm=1 + _randn(H, seed=4).abs(),
                        gate_up=_randn(2 * INTER, H, seed=5), down=_randn(H, INTER, seed=6),
                        qkv_bias=_randn((nh + 2 * nkv) * d, seed=7) if bias else None)


def _rms(x, w):
    return x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * w


def _block(layer: LayerWeights, h: torch.Tensor, record=None) -> torch.Tensor:
    """One pre-norm decoder layer, causal GQA attention and SwiGLU, no rotary (the fold
    does not touch q and k's directions, only v's scale). record(name, x) sees each
    matmul's input."""
    nh, nkv, d = HEADS.num_heads, HEADS.num_kv_heads, HEADS.head_dim

    def mm(name, x, w, b=None):
        if record is not None:
            record(name, x)
        return F.linear(x, w.double(), None if b is None else b.double())
    qkv = mm("qkv", _rms(h, layer.attn_norm.double()), layer.qkv, layer.qkv_bias)
    q, k, v = qkv.split([nh * d, nkv * d, nkv * d], dim=-1)
    q, k, v = (t.view(T, -1, d).transpose(0, 1) for t in (q, k, v))
    k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
    att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(T, nh * d)
    h = h + mm("o", att, layer.o)
    gate, up = mm("gate_up", _rms(h, layer.mlp_norm.double()), layer.gate_up).chunk(2, dim=-1)
    return h + mm("down", F.silu(gate) * up, layer.down)


def _relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return ((ours - theirs).norm() / theirs.norm()).item()


def _calibrated(layer: LayerWeights, h: torch.Tensor) -> smoothing.Calibration:
    calibration = smoothing.Calibration()
    weights = {"qkv": layer.qkv, "o": layer.o, "gate_up": layer.gate_up, "down": layer.down}
    _block(layer, h, lambda name, x: calibration.linear(x.to(weights[name].dtype), weights[name]))
    return calibration


def _hidden(seed=8):
    h = _randn(T, H, seed=seed)
    h[:, 3] *= 25                   # an outlier channel in every token, as real models have
    return h


@pytest.mark.parametrize("bias", [False, True])
def test_the_fold_leaves_the_layer_unchanged(bias):
    layer, h = _layer(bias), _hidden()
    folded = smoothing.fold(layer, _calibrated(layer, h), HEADS)
    # the fold computes in float32: equal to float32's rounding
    assert _relative_error(_block(folded, h), _block(layer, h)) < 1e-6
    # and it did change the weights (a fold that did nothing would pass the line above)
    assert not torch.allclose(folded.qkv.double(), layer.qkv)
    assert not torch.allclose(folded.o.double(), layer.o)


def test_a_wrong_group_for_o_is_caught():
    """o's factors are per kv head's channel, shared by its group's query heads; the same
    check fails when they are laid out the other way (so it can tell)."""
    layer, h = _layer(False), _hidden()
    calibration = _calibrated(layer, h)
    folded = smoothing.fold(layer, calibration, HEADS)
    swapped = dataclasses.replace(folded, o=layer.o * folded.o.double().div(layer.o)[0].view(
        HEADS.num_kv_heads, -1, HEADS.head_dim).transpose(0, 1).reshape(-1))
    assert _relative_error(_block(swapped, h), _block(layer, h)) > 1e-3


def test_the_outliers_move_into_the_weights():
    """After the fold the activations' channel maxima are flatter: at alpha 1/2 X / s and
    W * s have equal column maxima (sqrt(max|X| max|W|) both)."""
    layer, h = _layer(False), _hidden()
    calibration = _calibrated(layer, h)
    amax = calibration.of(layer.qkv)
    s = smoothing.factors(amax, layer.qkv.abs().amax(dim=0), alpha=0.5)
    assert torch.allclose(amax.double() / s.double(), (layer.qkv * s.double()).abs().amax(dim=0), rtol=1e-5)
    folded = smoothing.fold(layer, calibration, HEADS)
    after = _calibrated(folded, h).of(folded.qkv)
    spread = (amax.max() / amax.median()).item()
    assert (after.max() / after.median()).item() < spread / 3


def test_calibration_records_the_largest_input_per_channel_over_calls():
    calibration = smoothing.Calibration()
    w = torch.zeros(2, 3)
    calibration.linear(torch.tensor([[1.0, -5.0, 0.0]]), w)
    calibration.linear(torch.tensor([[-2.0, 1.0, 0.5], [0.0, 0.0, -0.25]]), w)
    assert calibration.of(w).tolist() == [2.0, 5.0, 0.5]
    assert calibration.of(torch.zeros(2, 4)).tolist() == [0.0] * 4     # never ran: zeros


def test_the_calibration_ids_are_fixed_and_in_range():
    ids = smoothing.calibration_ids(512)
    assert ids == smoothing.calibration_ids(512) and len(ids) == smoothing.CALIBRATION_TOKENS
    assert min(ids) >= 5 and max(ids) < 512


def test_a_bf16_norm_scales_the_weight_by_what_its_rounding_applied():
    """norm / s rounds in bf16: the weight is scaled by the factor the rounded norm really
    carries, so the product of the two stays exact (within float32)."""
    layer = _layer(False)
    layer = dataclasses.replace(layer, attn_norm=layer.attn_norm.to(torch.bfloat16),
                                mlp_norm=layer.mlp_norm.to(torch.bfloat16))
    h = _hidden()
    folded = smoothing.fold(layer, _calibrated(layer, h), HEADS)
    assert folded.attn_norm.dtype == torch.bfloat16
    # the function rms(h) * norm -> qkv is what the fold must keep
    before = F.linear(layer.attn_norm.double() * h, layer.qkv)
    after = F.linear(folded.attn_norm.double() * h, folded.qkv.double())
    v_rows = slice((HEADS.num_heads + HEADS.num_kv_heads) * HEADS.head_dim, None)
    q_k = slice(0, v_rows.start)
    assert _relative_error(after[:, q_k], before[:, q_k]) < 1e-6
