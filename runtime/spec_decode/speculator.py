"""Speculative decoding around the engine step (no torch here).

Each step, after the scheduler picked the batch (reserving k lookahead slots for every
decoding sequence), the Speculator asks its proposer for up to k next tokens per decoding
sequence and attaches them to that sequence's chunk; the model runner verifies them in
the same forward pass (runtime/spec_decode/rejection_sampler.py) and emits accepted + 1 tokens.
A backoff policy, a pure function over counts, shrinks or skips speculation when the
batch is large (verification is no longer free) or recent acceptance is low.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from runtime.spec_decode.proposers import NgramProposer, Proposer, ProposalRequest
from runtime.engine.request import Request
from runtime.engine.scheduler import RunnerOutput, ScheduledChunk, SchedulerOutput

METHODS = ("ngram", "draft")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    k: int = 4
    n: int = 3                         # ngram: longest n-gram looked up
    model: Optional[str] = None        # draft: model folder
    max_batch: int = 8                 # backoff: no speculation above this many decoding sequences
    min_acceptance: float = 0.3        # backoff: k shrinks to 1 below this recent acceptance rate

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> "SpeculativeConfig":
        if not isinstance(raw, Mapping):
            raise ValueError("speculative: must be an object such as {\"method\": \"ngram\", \"k\": 4}")
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"speculative: unknown keys {sorted(unknown)}")
        config = cls(**raw)
        config.validate()
        return config

    def validate(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative: method {self.method!r} is not one of {', '.join(METHODS)}")
        for name in ("k", "n", "max_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"speculative: {name} must be a positive integer")
        if self.method == "draft" and not self.model:
            raise ValueError("speculative: method 'draft' needs a model folder ('model')")


@dataclass(frozen=True)
class BackoffPolicy:
    max_batch: int = 8
    min_acceptance: float = 0.3
    alpha: float = 0.1                 # weight of the newest step in the acceptance EWMA


def speculation_k(policy: BackoffPolicy, k: int, num_decoding: int, acceptance: float) -> int:
    """How many tokens to propose per sequence this step."""
    if num_decoding > policy.max_batch:
        return 0
    if acceptance < policy.min_acceptance:
        return 1                       # cheap probe: acceptance can recover
    return k


def updated_acceptance(policy: BackoffPolicy, acceptance: float, proposed: int, accepted: int) -> float:
    if proposed == 0:
        return acceptance
    return (1 - policy.alpha) * acceptance + policy.alpha * accepted / proposed


class Speculator:
    def __init__(self, proposer: Proposer, k: int, max_model_len: int,
                 policy: BackoffPolicy = BackoffPolicy()):
        self.proposer = proposer
        self.k = k
        self.max_model_len = max_model_len
        self.policy = policy
        self.acceptance = 1.0          # EWMA of accepted / proposed, optimistic at the start
        self.num_proposed = 0
        self.num_accepted = 0

    def propose(self, batch: SchedulerOutput, requests: Mapping[str, Request]) -> None:
        """Attach proposals to the decoding chunks of `batch` (in place)."""
        self.proposer.release(batch.finished + batch.preempted)
        # a structured output's tokens are masked one at a time: never proposed for
        decodes = [c for c in batch.chunks if c.sample and len(c.token_ids) == 1
                   and c.params.structured_output is None]
        k = speculation_k(self.policy, self.k, len(decodes), self.acceptance)
        asks = [self._ask(c, requests[c.request_id], k) for c in decodes] if k else []
        asks = [a for a in asks if a.k > 0]
        proposals = self.proposer.propose(asks) if asks else {}
        for chunk in decodes:
            proposal = proposals.get(chunk.request_id)
            if proposal is not None:
                chunk.draft_token_ids = proposal.token_ids
                chunk.draft_probs = proposal.probs

    def _ask(self, chunk: ScheduledChunk, request: Request, k: int) -> ProposalRequest:
        # never propose past max_tokens or the context: at most k + 1 tokens come out
        room = min(request.params.max_tokens - request.num_output_tokens - 1,
                   self.max_model_len - request.num_tokens)
        return ProposalRequest(chunk.request_id, request.token_ids, min(k, room), chunk.params)

    def record(self, batch: SchedulerOutput, result: RunnerOutput) -> None:
        """Count what the runner accepted (every emitted token but the last was a proposal)."""
        proposed = accepted = 0
        for chunk in batch.chunks:
            if chunk.draft_token_ids:
                proposed += len(chunk.draft_token_ids)
                accepted += len(result.token_ids[chunk.request_id]) - 1
        self.num_proposed += proposed
        self.num_accepted += accepted
        self.acceptance = updated_acceptance(self.policy, self.acceptance, proposed, accepted)


def make_speculator(raw: Mapping[str, Any], engine_config, max_model_len: int, num_blocks: int) -> Speculator:
    config = SpeculativeConfig.parse(raw)
    policy = BackoffPolicy(max_batch=config.max_batch, min_acceptance=config.min_acceptance)
    return Speculator(make_proposer(config, engine_config, num_blocks), config.k, max_model_len, policy)


def make_proposer(config: SpeculativeConfig, engine_config, num_blocks: int) -> Proposer:
    if config.method == "ngram":
        return NgramProposer(config.n)
    from runtime.spec_decode.draft_model import DraftModelProposer   # torch and a second model
    return DraftModelProposer(config.model, engine_config, num_blocks)
