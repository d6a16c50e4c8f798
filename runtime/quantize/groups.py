"""Group-wise 4-bit weights as the quantizers make them, and the rounding they share.

A quantized linear stores w[n, k] = scales[n, g] * (codes[n, k] - zeros[n, g]) with
g = g_idx[k]: codes and integer zeros 0..15 and float16 scales, the value set every
4-bit format the engine reads (AWQ, GPTQ) holds. The scales are rounded to float16 when
they are found, before any weight is rounded with them, so the quantizer's own
dequantized weights are what a reader of the written folder computes, bit for bit
(a float16 scale times a 4-bit integer is exact in float32).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

MAXQ = 15                      # 4 bits
MIN_SCALE = 1e-5               # AutoAWQ's floor: a constant group still gets a finite scale


@dataclass(frozen=True)
class QuantizedLinear:
    codes: torch.Tensor        # [N, K] int32, 0..MAXQ
    scales: torch.Tensor       # [N, G] float16
    zeros: torch.Tensor        # [N, G] int32, 0..MAXQ
    g_idx: torch.Tensor        # [K] int64: the group of each input column

    @property
    def group(self) -> int:
        return int(self.codes.shape[1]) // int(self.scales.shape[1])

    def dequantized(self) -> torch.Tensor:
        """[N, K] float32, exactly."""
        g = self.g_idx
        return self.scales.float()[:, g] * (self.codes - self.zeros[:, g]).float()

    def rows(self, start: int, stop: int) -> "QuantizedLinear":
        """Output channels [start, stop): one of q, k, v quantized together."""
        return QuantizedLinear(self.codes[start:stop], self.scales[start:stop], self.zeros[start:stop], self.g_idx)


@dataclass(frozen=True)
class Grid:
    """One group's 4-bit grid per row: value = scale * (code - zero)."""
    scale: torch.Tensor        # [N] float16
    zero: torch.Tensor         # [N] int32

    def codes(self, w: torch.Tensor) -> torch.Tensor:
        """w [N] or [N, C] (float) -> int32 codes, nearest on the grid."""
        s, z = self._against(w)
        return (torch.round(w / s) + z).clamp(0, MAXQ).to(torch.int32)

    def rounded(self, w: torch.Tensor) -> torch.Tensor:
        """values(codes(w)), float all the way (the searches round many candidates)."""
        s, z = self._against(w)
        zf = z.float()
        return s * (torch.clamp(torch.round(w / s) + zf, 0, MAXQ) - zf)

    def values(self, codes: torch.Tensor) -> torch.Tensor:
        s, z = self._against(codes)
        return s * (codes - z).float()

    def _against(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The scale (float32) and zero of each row, to broadcast against t [N] or [N, C]."""
        s, z = self.scale.float(), self.zero
        return (s, z) if t.dim() == 1 else (s[:, None], z[:, None])


def minmax_grid(w: torch.Tensor, sym: bool = False, include_zero: bool = True, min_zero: int = 0) -> Grid:
    """The grid of each row of w [N, C] spanning its min and max.

    include_zero: the range is widened to hold 0 (GPTQ's Quantizer.find_params); AWQ's
    pseudo_quantize_tensor spans [min, max] as they are. sym: centred on zero 8 over
    [-max|w|, max|w|]. min_zero: GPTQ v1 checkpoints store zero - 1, so their zeros are
    kept at 1 or more."""
    lo, hi = w.amin(dim=1), w.amax(dim=1)
    if include_zero:
        lo, hi = lo.clamp(max=0), hi.clamp(min=0)
    if sym:
        hi = torch.maximum(lo.abs(), hi)
        lo = torch.where(lo < 0, -hi, lo)
    scale = ((hi - lo).clamp(min=MIN_SCALE) / MAXQ).half()
    if sym:
        zero = torch.full_like(scale, (MAXQ + 1) // 2, dtype=torch.int32)
    else:
        zero = torch.round(-lo / scale.float()).clamp(min_zero, MAXQ).to(torch.int32)
    return Grid(scale, zero)


def round_to_nearest(weight: torch.Tensor, group: int, sym: bool = False, include_zero: bool = True,
                     min_zero: int = 0) -> QuantizedLinear:
    """Each group of `group` consecutive input columns on its own min-max grid, every
    weight rounded to its nearest value: no error correction (the baseline; AWQ's last step)."""
    n, k = weight.shape
    w = weight.float()
    grids = [minmax_grid(w[:, c:c + group], sym, include_zero, min_zero) for c in range(0, k, group)]
    codes = torch.cat([g.codes(w[:, i * group:(i + 1) * group]) for i, g in enumerate(grids)], dim=1)
    return QuantizedLinear(codes, torch.stack([g.scale for g in grids], dim=1),
                           torch.stack([g.zero for g in grids], dim=1), torch.arange(k) // group)
