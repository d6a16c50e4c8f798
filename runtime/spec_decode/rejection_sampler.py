"""Verify speculative proposals against the target model's logits in one step.

The target scored the last committed token and the k proposals in one forward pass,
so row i of its logits is the distribution of the token after proposal i-1 (row 0:
after the committed token). What comes out is the accepted proposals plus one more
token (the correction at the first rejection, or the bonus after all k): between 1
and k+1 tokens, each distributed exactly as the target would have sampled it.
"""
from __future__ import annotations

from typing import Optional

import torch

from runtime.engine.sampler import filter_logits
from wire.sampling import SamplingParams


def speculative_verify(logits: torch.Tensor, draft_ids: list[int], draft_probs: Optional[torch.Tensor],
                       params: SamplingParams, gen: torch.Generator) -> list[int]:
    """logits [k+1, V] fp32; draft_ids k tokens; draft_probs [k, V] or None (one-hot proposals)."""
    if params.greedy:
        return greedy_verify(logits, draft_ids)
    return rejection_sample(target_probs(logits, params), draft_ids, draft_probs, gen)


def greedy_verify(logits: torch.Tensor, draft_ids: list[int]) -> list[int]:
    """Keep proposals while they equal the target's argmax; then emit the argmax itself."""
    target = logits.argmax(dim=-1).tolist()
    out = []
    for draft, best in zip(draft_ids, target):
        out.append(best)
        if draft != best:
            return out
    out.append(target[len(draft_ids)])
    return out


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[k+1, V] the distributions the target samples from (temperature, top-k, top-p)."""
    rows = [filter_logits(row / params.temperature, params.top_k, params.top_p) for row in logits]
    return torch.softmax(torch.stack(rows), dim=-1)


def rejection_sample(p: torch.Tensor, draft_ids: list[int], q: Optional[torch.Tensor],
                     gen: torch.Generator) -> list[int]:
    """p [k+1, V] target, q [k, V] proposer (None: one-hot on each proposal) -> emitted tokens."""
    k = len(draft_ids)
    ids = torch.tensor(draft_ids, device=p.device)
    if q is None:
        q = torch.nn.functional.one_hot(ids, p.shape[-1]).to(p.dtype)
    rows = torch.arange(k, device=p.device)
    p_x, q_x = p[rows, ids], q[rows, ids]
    u = torch.rand(k, generator=gen, device=p.device)
    # Accept proposal x with probability min(1, p(x)/q(x)); at the first rejection draw from
    # norm(max(0, p - q)) instead and stop; if all k pass, draw a bonus token from p's last row.
    # Each emitted token is then distributed as p exactly (Leviathan et al., 2023, appendix A).
    accepted = (u * q_x < p_x).tolist()
    for i, ok in enumerate(accepted):
        if not ok:
            return draft_ids[:i] + [_draw(_residual(p[i], q[i]), gen)]
    return draft_ids + [_draw(p[k], gen)]


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    residual = (p - q).clamp(min=0)
    total = residual.sum()
    return residual / total if total > 0 else p


def _draw(probs: torch.Tensor, gen: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=gen))
