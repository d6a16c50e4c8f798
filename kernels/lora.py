"""The gathered LoRA delta, torch reference (Punica's BGMV: each row its own adapter).

lora_delta(x [T, K], a [L, R, K], b [L, N, R], slots [T] long) -> [T, N] float32:
row t gets b[s] @ (a[s] @ x[t]) with s = slots[t], and zeros where s < 0 (the base
model). Adapters of a smaller rank are zero-padded to R; their scaling is folded into b.
Rows are grouped by slot, so each adapter's two matmuls run once over its rows.
"""
from __future__ import annotations

import torch


def lora_delta(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(x.shape[0], b.shape[1], dtype=torch.float32, device=x.device)
    xf = x.float()
    for slot in torch.unique(slots).tolist():
        if slot < 0:
            continue
        rows = (slots == slot).nonzero().squeeze(1)
        shrunk = xf.index_select(0, rows) @ a[slot].T                 # [n, R]
        out.index_copy_(0, rows, shrunk @ b[slot].T)                   # [n, N]
    return out
