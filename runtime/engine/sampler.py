"""Turn logits into tokens: greedy, temperature, top-k, top-p, seeds, top-N logprobs.

Every request draws from its own torch.Generator (seeded by its seed, or by the
engine seed and arrival order), so a seeded request samples the same tokens alone
or inside any batch. Greedy rows are one batched argmax.
"""
from __future__ import annotations

from typing import Optional

import torch

from runtime.engine.outputs import TokenLogprobs
from runtime.engine.penalties import History, apply_processors
from runtime.engine.structured_output import TokenMask
from wire.sampling import SamplingParams


class Sampler:
    def __init__(self, device: str = "cpu", seed: int = 0):
        self.device = device
        self._seeds = torch.Generator().manual_seed(seed)     # for requests without a seed
        self._generators: dict[str, torch.Generator] = {}

    def release(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor, request_ids: list[str],
               params: list[SamplingParams], histories: Optional[list[Optional[History]]] = None,
               token_mask: Optional[TokenMask] = None) -> tuple[list[int], list[Optional[TokenLogprobs]]]:
        """logits [N, V] fp32 -> one token (and optional logprobs) per row; `histories` feed
        the penalties and the other logits processors (runtime/engine/penalties.py)."""
        if histories is not None:
            logits = apply_processors(logits, params, histories)
        if token_mask is not None:   # structured outputs: only the grammar's tokens remain
            logits = token_mask.apply(logits)
        tokens = logits.argmax(dim=-1)
        for row, (request_id, p) in enumerate(zip(request_ids, params)):
            if not p.greedy:
                tokens[row] = self._draw(logits[row], p, self.generator(request_id, p))
        token_list = tokens.tolist()
        return token_list, self.logprobs(logits, token_list, params)

    def generator(self, request_id: str, p: SamplingParams) -> torch.Generator:
        gen = self._generators.get(request_id)
        if gen is None:
            seed = p.seed if p.seed is not None else int(torch.randint(0, 2**62, (1,), generator=self._seeds))
            gen = torch.Generator(device=self.device).manual_seed(seed)
            self._generators[request_id] = gen
        return gen

    def _draw(self, row: torch.Tensor, p: SamplingParams, gen: torch.Generator) -> int:
        probs = torch.softmax(filter_logits(row / p.temperature, p.top_k, p.top_p), dim=-1)
        return int(torch.multinomial(probs, 1, generator=gen))

    def logprobs(self, logits: torch.Tensor, tokens: list[int],
                  params: list[SamplingParams]) -> list[Optional[TokenLogprobs]]:
        rows = [i for i, p in enumerate(params) if p.logprobs is not None]
        out: list[Optional[TokenLogprobs]] = [None] * len(params)
        if not rows:
            return out
        logp = torch.log_softmax(logits[rows], dim=-1)
        top_n = max(params[i].logprobs for i in rows)
        top_vals, top_ids = logp.topk(max(top_n, 1), dim=-1)
        chosen = logp[torch.arange(len(rows)), torch.tensor([tokens[i] for i in rows])].tolist()
        top_vals, top_ids = top_vals.tolist(), top_ids.tolist()
        for j, i in enumerate(rows):
            n = params[i].logprobs
            out[i] = (chosen[j], list(zip(top_ids[j][:n], top_vals[j][:n])))
        return out


def filter_logits(row: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) what top-k and top-p cut from one row of logits [V]."""
    if 0 < top_k < row.shape[-1]:
        kth = torch.topk(row, top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token once the mass strictly before it already reaches top_p; keep the first
        drop = (probs.cumsum(-1) - probs) >= top_p
        drop[0] = False
        row = row.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return row
