"""Sparse mixture-of-experts references (pure torch): the router's choice and the experts.

route(router_logits [T, E], top_k, normalize) -> (weights [T, k] fp32, expert_ids [T, k] long)
    softmax over the experts in fp32, the top_k of them; normalize: their weights are
    rescaled to sum to 1 (Mixtral always, Qwen3-MoE when norm_topk_prob).

moe_experts(x [T, H], gate_up [E, 2I, H], down [E, H, I], weights [T, k], expert_ids [T, k])
    -> [T, H]: sum over k of weights[t, k] * expert(expert_ids[t, k], x[t]), where an expert
    is a SwiGLU MLP: down[e] @ silu_and_mul(gate_up[e] @ x).
    Tokens are grouped by expert with one stable sort, then each expert that has tokens runs
    two matmuls over all of its rows at once: a Python loop over experts, never over tokens.
    Each term is weighted in fp32 and rounded to x's dtype once, then summed per token.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.activation import silu_and_mul


def route(router_logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, expert_ids = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, expert_ids


def moe_experts(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor,
                expert_ids: torch.Tensor) -> torch.Tensor:
    top_k = expert_ids.shape[1]
    order = expert_ids.flatten().argsort(stable=True)                  # [T*k], by expert
    counts = torch.bincount(expert_ids.flatten(), minlength=gate_up.shape[0]).tolist()
    tokens = order // top_k                                            # the row of x of each
    rows = x.index_select(0, tokens)                                   # [T*k, H]
    out = torch.empty_like(rows)                                       # [T*k, H], by expert
    start = 0
    for expert, n in enumerate(counts):
        if n:
            hidden = silu_and_mul(F.linear(rows[start:start + n], gate_up[expert]))
            out[start:start + n] = F.linear(hidden, down[expert])
            start += n
    weighted = (out * weights.flatten().index_select(0, order)[:, None]).to(x.dtype)
    return torch.zeros_like(x).index_add_(0, tokens, weighted)
