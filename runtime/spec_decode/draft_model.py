"""DraftModelProposer: a smaller model with the same tokenizer proposes k tokens.

It runs through the same ModelRunner / model code (runtime/models/) as the target, with its own
paged KV cache and block tables (its own BlockManager). Per sequence it remembers how
many real tokens its cache holds; each step it first catches up on the tokens committed
since (one varlen pass over all sequences), then decodes k - 1 more proposals one pass
at a time. Proposals it wrote past the real tokens are overwritten by the next catch-up.
"""
from __future__ import annotations

import dataclasses
import zlib
from typing import Optional

import torch

from runtime.engine.block_manager import BlockManager
from runtime.core.config import EngineConfig, ModelConfig
from runtime.load.timings import LoadTimings
from runtime.engine.model_runner import ModelRunner, prefills_first
from runtime.spec_decode.proposers import Proposal, ProposalRequest
from runtime.spec_decode.rejection_sampler import target_probs
from runtime.engine.scheduler import ScheduledChunk
from runtime.core.sleep_mode import Freed


class DraftModelProposer:
    def __init__(self, model_dir: str, target: EngineConfig, num_blocks: int):
        config = dataclasses.replace(target, model=str(model_dir), kv_cache_tokens=num_blocks * target.block_size,
                                     tensor_parallel_size=1,   # the draft is small: rank 0 runs it whole
                                     speculative=None, quantization=None, enable_prefix_caching=False)
        self.model_config = ModelConfig.from_dir(model_dir)
        if self.model_config.vocab_size != ModelConfig.from_dir(target.model).vocab_size:
            raise ValueError("speculative: the draft model's vocab_size differs from the target's")
        self.runner = ModelRunner(self.model_config, config, LoadTimings())
        self.blocks = BlockManager(self.runner.num_blocks, target.block_size, enable_prefix_caching=False)
        self.computed: dict[str, int] = {}       # real tokens whose k/v the draft cache holds
        self.generators: dict[str, torch.Generator] = {}

    def release(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            if self.computed.pop(request_id, None) is not None:
                self.blocks.deallocate(request_id)
            self.generators.pop(request_id, None)

    def sleep(self) -> Freed:
        return self.runner.sleep()

    def wake(self) -> None:
        self.runner.wake()

    @torch.inference_mode()
    def propose(self, asks: list[ProposalRequest]) -> dict[str, Proposal]:
        asks = [a for a in asks if self._reserve(a)]
        if not asks:
            return {}
        chunks = [self._catch_up(a) for a in asks]
        drafts: dict[str, list[int]] = {a.request_id: [] for a in asks}
        probs: dict[str, list[torch.Tensor]] = {a.request_id: [] for a in asks}
        for _ in range(max(a.k for a in asks)):
            chunks = prefills_first(chunks)
            logits = self.runner.compute_logits(chunks)
            by_id = {a.request_id: a for a in asks}
            for chunk, row in zip(chunks, logits):
                self._draw(by_id[chunk.request_id], row, drafts, probs)
            chunks = [self._next(a, drafts[a.request_id]) for a in asks if len(drafts[a.request_id]) < a.k]
            if not chunks:
                break
        return {rid: Proposal(tokens, _stack(probs[rid])) for rid, tokens in drafts.items()}

    def _reserve(self, ask: ProposalRequest) -> bool:
        """Room for the real tokens and k - 1 proposals; False: no speculation this step."""
        rid, need = ask.request_id, len(ask.token_ids) + ask.k - 1
        if rid not in self.computed:
            if not self.blocks.can_allocate([], need):
                return False
            self.blocks.allocate(rid, [], need)
            self.computed[rid] = 0
        elif not self.blocks.can_append(rid, need):
            return False
        self.blocks.append_slot(rid, need)
        return True

    def _catch_up(self, ask: ProposalRequest) -> ScheduledChunk:
        start = self.computed[ask.request_id]
        self.computed[ask.request_id] = len(ask.token_ids)    # only real tokens count as cached
        return self._chunk(ask, list(ask.token_ids[start:]), start)

    def _next(self, ask: ProposalRequest, drafts: list[int]) -> ScheduledChunk:
        return self._chunk(ask, drafts[-1:], len(ask.token_ids) + len(drafts) - 1)

    def _chunk(self, ask: ProposalRequest, tokens: list[int], start: int) -> ScheduledChunk:
        return ScheduledChunk(request_id=ask.request_id, token_ids=tokens, start=start,
                              block_table=self.blocks.block_table(ask.request_id), sample=True,
                              params=ask.params)

    def _draw(self, ask: ProposalRequest, row: torch.Tensor, drafts: dict, probs: dict) -> None:
        """Greedy: the draft's argmax. Sampling: draw from its distribution q and keep q."""
        if ask.params.greedy:
            drafts[ask.request_id].append(int(row.argmax()))
            return
        q = target_probs(row[None], ask.params)[0]
        token = int(torch.multinomial(q, 1, generator=self._generator(ask)))
        drafts[ask.request_id].append(token)
        probs[ask.request_id].append(q)

    def _generator(self, ask: ProposalRequest) -> torch.Generator:
        gen = self.generators.get(ask.request_id)
        if gen is None:
            seed = ask.params.seed if ask.params.seed is not None else zlib.crc32(ask.request_id.encode())
            gen = torch.Generator(device=self.runner.device).manual_seed(seed + 1)
            self.generators[ask.request_id] = gen
        return gen


def _stack(rows: list[torch.Tensor]) -> Optional[torch.Tensor]:
    return torch.stack(rows) if rows else None
