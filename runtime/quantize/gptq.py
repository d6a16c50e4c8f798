"""GPTQ (Frantar et al., 2022): each linear's weights rounded one input column at a time,
the rounding error of each column spread over the columns not yet rounded so that the
layer's output on calibration inputs X moves as little as it can.

Follows the reference (IST-DASLab/gptq, AutoGPTQ's and GPTQModel's `fasterquant`):
- H = 2/n X^T X over the calibration rows (`Hessian`); dead inputs (H_jj = 0) are zeroed;
  1% of mean(diag H) is added to its diagonal (`DAMP`);
- act_order (desc_act): columns are taken by decreasing diag(H), and g_idx maps each
  input column back to its group;
- the upper Cholesky factor of H^-1; columns in blocks of BLOCK, the error of a block
  propagated to the later columns in one matmul (lazy batch updates);
- each group's grid is found from the running (already corrected) weights when the loop
  reaches its first column (static_groups off), asymmetric min-max over a range that
  holds 0 (or symmetric). Its scale is float16 from the start (groups.py), and the zero
  is kept at 1 or more: GPTQ v1 checkpoints store zero - 1.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

from runtime.quantize.groups import Grid, QuantizedLinear, minmax_grid, round_to_nearest
from runtime.quantize.layers import SITES, FloatModel, LayerRunner, layer_prefix, weight_name

DAMP = 0.01                    # of mean(diag H), added to diag H
BLOCK = 128                    # columns per lazy batch update
MIN_ZERO = 1                   # GPTQ v1 stores zero - 1: a zero of 0 has no encoding
NAME = "gptq"
log = logging.getLogger(__name__)


class Hessian:
    """2/n X^T X of a linear's inputs, accumulated batch by batch (the sum in float64)."""

    def __init__(self, columns: int) -> None:
        self.sum = torch.zeros(columns, columns, dtype=torch.float64)
        self.rows = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).float()
        self.sum += (x.T @ x).double()
        self.rows += x.shape[0]

    def value(self) -> torch.Tensor:
        return (2 / max(self.rows, 1) * self.sum).float()


def gptq(weight: torch.Tensor, hessian: torch.Tensor, group: int, act_order: bool = False,
         sym: bool = False, damp: float = DAMP) -> QuantizedLinear:
    """weight [N, K] (float), hessian [K, K] of its inputs -> the quantized linear, its
    columns in the weight's own order (g_idx: each column's group)."""
    w = weight.float().clone()
    h = hessian.float().clone()
    n, k = w.shape
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    perm = torch.argsort(torch.diag(h), descending=True) if act_order else torch.arange(k)
    w, h = w[:, perm], h[perm][:, perm]
    h += torch.eye(k) * (damp * torch.mean(torch.diag(h)))
    hinv = _inverse_cholesky(h)
    threads = torch.get_num_threads()
    # the loop's ops are small (a column, a [N, 128] update): one parallel region each
    # costs more than the op, and many times more on a CPU whose cores are busy
    torch.set_num_threads(1)
    try:
        codes, grids = _columns(w, hinv, group, sym)
    finally:
        torch.set_num_threads(threads)
    inverse = torch.argsort(perm)
    g_idx = (torch.arange(k) // group)[inverse]
    return QuantizedLinear(codes[:, inverse], torch.stack([g.scale for g in grids], dim=1),
                           torch.stack([g.zero for g in grids], dim=1), g_idx)


def _columns(w: torch.Tensor, hinv: torch.Tensor, group: int, sym: bool) -> tuple[torch.Tensor, list[Grid]]:
    """The column loop over w [N, K] (updated in place): codes [N, K] and the grid of each
    group, both in w's column order."""
    n, k = w.shape
    codes = torch.zeros(n, k, dtype=torch.int32)
    grids: list[Grid] = []
    for b1 in range(0, k, BLOCK):
        b2 = min(b1 + BLOCK, k)
        w1, err1 = w[:, b1:b2].clone(), torch.zeros(n, b2 - b1)
        hinv1 = hinv[b1:b2, b1:b2]
        for i in range(b2 - b1):
            col = b1 + i
            if col % group == 0:
                # the reference reads the group's columns from W, whose columns in this
                # block lack this block's updates (the same thing when group == BLOCK)
                grids.append(minmax_grid(w[:, col:col + group], sym=sym, min_zero=MIN_ZERO))
            q = grids[-1].codes(w1[:, i])
            codes[:, col] = q
            err = (w1[:, i] - grids[-1].values(q)) / hinv1[i, i]
            w1[:, i:] -= err[:, None] @ hinv1[i, i:][None, :]
            err1[:, i] = err
        w[:, b2:] -= err1 @ hinv[b1:b2, b2:]
    return codes, grids


def _inverse_cholesky(h: torch.Tensor) -> torch.Tensor:
    """The upper Cholesky factor of h^-1 (h symmetric positive definite)."""
    lower = torch.linalg.cholesky(h.double())
    upper: torch.Tensor = torch.linalg.cholesky(torch.cholesky_inverse(lower), upper=True)
    return upper.float()


def quantize_model(model: FloatModel, runner: Optional[LayerRunner], group: int, act_order: bool = False,
                   sym: bool = False) -> dict[str, QuantizedLinear]:
    """Every decoder linear of `model`, by its name without `.weight`. Layer by layer: each
    layer's inputs come from the layers before it already quantized (the reference's
    sequential order); its q/k/v and gate/up, which read one input, share one Hessian and
    are quantized as one matrix (GPTQ treats rows independently, so this is the same as
    one at a time). runner None: plain round-to-nearest on the same grids, nothing
    calibrated (the baseline GPTQ is measured against)."""
    out: dict[str, QuantizedLinear] = {}
    h = runner.embed(model) if runner is not None else None
    for i in range(model.config.num_hidden_layers):
        layer = model.layer(i)
        inputs = runner.forward(h, layer, i)[1] if runner is not None and h is not None else {}
        quantized = dict(layer)
        for site, names in SITES.items():
            w = torch.cat([layer[weight_name(n)] for n in names])
            if runner is not None:
                hessian = Hessian(w.shape[1])
                hessian.add(inputs[site])
                q = gptq(w, hessian.value(), group, act_order, sym)
            else:
                q = round_to_nearest(w, group, sym=sym, min_zero=MIN_ZERO)
            start = 0
            for name in names:
                rows = layer[weight_name(name)].shape[0]
                part = q.rows(start, start + rows)
                out[layer_prefix(i) + weight_name(name)[:-len(".weight")]] = part
                quantized[weight_name(name)] = part.dequantized()
                start += rows
        if runner is not None and h is not None:
            h = runner.forward(h, quantized, i)[0]
        log.info("%s: layer %d of %d quantized", NAME, i + 1, model.config.num_hidden_layers)
    return out
