"""The gathered LoRA delta, torch reference (Punica's BGMV: each row its own adapter).

lora_delta(x [T, K], a [L, R, K], b [L, R, N], slots [T] long, splits=()) -> [T, N] float32:
row t gets (a[s] @ x[t]) @ b[s] with s = slots[t], and zeros where s < 0 (the base
model): b is PEFT's lora_B transposed, so that expanding adds whole rows of it. Adapters
of a smaller rank are zero-padded to R; their scaling is folded into b. splits: a fused
projection's output sizes (q, k, v): part p's columns take only rows p * R / parts ..
of b, the rest of its column being zeros (a kernel may skip them; this one multiplies
them).
Rows are grouped by slot, so each adapter's two matmuls run once over its rows.
"""
from __future__ import annotations

from typing import Sequence

import torch


def lora_delta(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor,
               splits: Sequence[int] = ()) -> torch.Tensor:
    out = torch.zeros(x.shape[0], b.shape[2], dtype=torch.float32, device=x.device)
    xf = x.float()
    for slot in torch.unique(slots).tolist():
        if slot < 0:
            continue
        rows = (slots == slot).nonzero().squeeze(1)
        shrunk = xf.index_select(0, rows) @ a[slot].T                 # [n, R]
        out.index_copy_(0, rows, shrunk @ b[slot])                     # [n, N]
    return out
