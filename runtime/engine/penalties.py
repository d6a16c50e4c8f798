"""Logits processors of issue 17, applied to the whole batch of rows before sampling.

Each is one tensor operation over the rows that ask for it (no loop per token):
repetition penalty (CTRL/HF: a seen token's logit divided by it when positive,
multiplied when negative; seen = prompt and output), OpenAI's frequency and
presence penalties (over the output only), logit bias, min_tokens (EOS and the
stop token ids at -inf until enough tokens came out) and min_p (a token whose
probability is under min_p times the top one's, at the row's temperature, goes).
Pure: logits in, logits out; the sampler draws from what this returns.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from runtime.engine.request import History
from wire.sampling import SamplingParams

__all__ = ["History", "apply_processors"]


def apply_processors(logits: torch.Tensor, params: Sequence[SamplingParams],
                     histories: Sequence[Optional[History]]) -> torch.Tensor:
    """logits [N, V] fp32 -> the same with every row's processors applied (a new tensor
    when any row has one; the input untouched)."""
    rows = [i for i, (p, h) in enumerate(zip(params, histories))
            if p.processes_logits and h is not None]
    if not rows:
        return logits
    logits = logits.clone()
    ps = [params[i] for i in rows]
    hs = [h for h in (histories[i] for i in rows) if h is not None]
    index = torch.tensor(rows, device=logits.device)
    sub = logits[index]
    sub = _repetition(sub, ps, hs)
    sub = _frequency_presence(sub, ps, hs)
    sub = _bias(sub, ps)
    sub = _min_tokens(sub, ps, hs)
    sub = _min_p(sub, ps)
    logits[index] = sub
    return logits


def _token_mask(sub: torch.Tensor, token_lists: Sequence[Sequence[int]]) -> torch.Tensor:
    """[R, V] counts of each token id in each row's list (padding lands in a spare column)."""
    vocab = sub.shape[-1]
    width = max((len(t) for t in token_lists), default=0)
    counts = torch.zeros(sub.shape[0], vocab + 1, device=sub.device)
    if width:
        padded = torch.tensor([list(t) + [vocab] * (width - len(t)) for t in token_lists],
                              dtype=torch.long, device=sub.device)
        counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=counts.dtype))
    return counts[:, :vocab]


def _repetition(sub: torch.Tensor, ps: list[SamplingParams],
                hs: list[History]) -> torch.Tensor:
    penalty = torch.tensor([p.repetition_penalty for p in ps], device=sub.device)[:, None]
    if bool((penalty == 1.0).all()):
        return sub
    seen = _token_mask(sub, [h.token_ids for h in hs]) > 0
    penalized = torch.where(sub > 0, sub / penalty, sub * penalty)
    return torch.where(seen, penalized, sub)


def _frequency_presence(sub: torch.Tensor, ps: list[SamplingParams],
                        hs: list[History]) -> torch.Tensor:
    freq = torch.tensor([p.frequency_penalty for p in ps], device=sub.device)[:, None]
    pres = torch.tensor([p.presence_penalty for p in ps], device=sub.device)[:, None]
    if not (bool(freq.any()) or bool(pres.any())):
        return sub
    counts = _token_mask(sub, [h.output_token_ids for h in hs])
    return sub - freq * counts - pres * (counts > 0).to(sub.dtype)


def _bias(sub: torch.Tensor, ps: list[SamplingParams]) -> torch.Tensor:
    pairs = [(r, t, b) for r, p in enumerate(ps) for t, b in p.logit_bias.items()]
    if not pairs:
        return sub
    rows, cols, bias = zip(*pairs)
    return sub.index_put((torch.tensor(rows, device=sub.device), torch.tensor(cols, device=sub.device)),
                         torch.tensor(bias, dtype=sub.dtype, device=sub.device), accumulate=True)


def _min_tokens(sub: torch.Tensor, ps: list[SamplingParams], hs: list[History]) -> torch.Tensor:
    banned = [list(h.eos_token_ids) + list(p.stop_token_ids)
              if len(h.token_ids) - h.num_prompt_tokens < p.min_tokens else []
              for p, h in zip(ps, hs)]
    if not any(banned):
        return sub
    return sub.masked_fill(_token_mask(sub, banned) > 0, float("-inf"))


def _min_p(sub: torch.Tensor, ps: list[SamplingParams]) -> torch.Tensor:
    """p_i < min_p * p_max  <=>  logit_i < logit_max + T * ln(min_p), at temperature T."""
    shift = [p.temperature * math.log(p.min_p) if p.min_p > 0 and not p.greedy else -math.inf
             for p in ps]
    if all(s == -math.inf for s in shift):
        return sub
    floor = sub.max(dim=-1, keepdim=True).values + torch.tensor(shift, device=sub.device)[:, None]
    return sub.masked_fill(sub < floor, float("-inf"))
