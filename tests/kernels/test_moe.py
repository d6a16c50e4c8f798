"""kernels/moe.py against a per-token loop over the chosen experts, over a grid of shapes."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.moe import moe_experts, route


def naive_moe(x, gate_up, down, weights, expert_ids):
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t].tolist(), expert_ids[t].tolist()):
            gate, up = (gate_up[e] @ x[t]).chunk(2)
            out[t] += w * (down[e] @ (F.silu(gate) * up))
    return out


@pytest.mark.parametrize("tokens,experts,top_k,hidden,inter", [
    (1, 8, 2, 16, 24), (7, 8, 2, 32, 16), (33, 4, 1, 16, 8), (20, 16, 4, 8, 12), (5, 8, 8, 16, 8)])
def test_experts_match_a_loop_over_tokens(tokens, experts, top_k, hidden, inter):
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, hidden, generator=g)
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=g) / hidden ** 0.5
    down = torch.randn(experts, hidden, inter, generator=g) / inter ** 0.5
    weights, ids = route(torch.randn(tokens, experts, generator=g), top_k, normalize=True)
    torch.testing.assert_close(moe_experts(x, gate_up, down, weights, ids),
                               naive_moe(x, gate_up, down, weights, ids), atol=1e-5, rtol=1e-5)


def test_experts_no_token_chose_are_skipped():
    x = torch.randn(3, 8)
    gate_up, down = torch.randn(4, 12, 8), torch.randn(4, 8, 6)
    ids = torch.tensor([[2], [2], [2]])
    weights = torch.ones(3, 1)
    down[[0, 1, 3]] = float("nan")              # never multiplied
    torch.testing.assert_close(moe_experts(x, gate_up, down, weights, ids),
                               naive_moe(x, gate_up, down, weights, ids))


@pytest.mark.parametrize("normalize", [True, False])
def test_route_takes_the_top_k_of_the_softmax(normalize):
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0], [3.0, 0.0, 0.0, 3.5]])
    weights, ids = route(logits, 2, normalize)
    assert ids.tolist() == [[1, 2], [3, 0]]
    probs = logits.softmax(-1)
    expected = probs.gather(1, ids)
    if normalize:
        expected = expected / expected.sum(-1, keepdim=True)
    torch.testing.assert_close(weights, expected)
    assert weights.dtype == torch.float32


def test_bf16_rounds_each_weighted_term_once():
    x = torch.randn(6, 16, dtype=torch.bfloat16)
    gate_up = torch.randn(4, 16, 16, dtype=torch.bfloat16) / 4
    down = torch.randn(4, 16, 8, dtype=torch.bfloat16) / 4
    weights, ids = route(torch.randn(6, 4), 2, normalize=True)
    out = moe_experts(x, gate_up, down, weights, ids)
    assert out.dtype == torch.bfloat16
    ref = naive_moe(x.float(), gate_up.float(), down.float(), weights, ids)
    torch.testing.assert_close(out.float(), ref, atol=5e-2, rtol=5e-2)
