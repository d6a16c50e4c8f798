"""Proposers for speculative decoding: who guesses the next k tokens (no torch here).

A proposer is a policy object with two implementations: NgramProposer (prompt lookup,
no second model, below) and DraftModelProposer (a smaller model, runtime/spec_decode/draft_model.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol, Sequence

from runtime.core.sleep_mode import Freed
from wire.sampling import SamplingParams


@dataclass(frozen=True)
class ProposalRequest:
    request_id: str
    token_ids: Sequence[int]        # prompt + output so far (the last one not yet in the cache)
    k: int                          # propose at most k tokens
    params: SamplingParams


@dataclass
class Proposal:
    token_ids: list[int]
    probs: Optional[Any] = None     # [len(token_ids), V] the proposer's distributions; None: one-hot


class Proposer(Protocol):
    def propose(self, asks: list[ProposalRequest]) -> dict[str, Proposal]: ...

    def release(self, request_ids: list[str]) -> None: ...

    def sleep(self) -> Freed:
        """Release the device memory it holds (runtime/core/sleep_mode.py); no request is held."""
        ...

    def wake(self) -> None: ...


def ngram_lookup(tokens: Sequence[int], k: int, n: int) -> list[int]:
    """The k tokens that followed the most recent earlier occurrence of the last n-gram,
    trying n, n-1, ... 1; [] when even the last token never occurred before."""
    for size in range(min(n, len(tokens) - 1), 0, -1):
        start = _last_occurrence(tokens, size)
        if start is not None:
            return list(tokens[start + size:start + size + k])
    return []


def _last_occurrence(tokens: Sequence[int], size: int) -> Optional[int]:
    """Start of the latest earlier occurrence of tokens[-size:] (not the suffix itself)."""
    pattern, last = list(tokens[-size:]), tokens[-1]
    for end in range(len(tokens) - 2, size - 2, -1):      # end: index of the match's last token
        if tokens[end] == last and list(tokens[end - size + 1:end + 1]) == pattern:
            return end - size + 1
    return None


class NgramProposer:
    """Prompt lookup decoding: copy what followed the same n-gram earlier in prompt + output."""

    def __init__(self, n: int = 3):
        self.n = n

    def propose(self, asks: list[ProposalRequest]) -> dict[str, Proposal]:
        found = {a.request_id: ngram_lookup(a.token_ids, a.k, self.n) for a in asks}
        return {rid: Proposal(tokens) for rid, tokens in found.items() if tokens}

    def release(self, request_ids: list[str]) -> None:
        pass                                                 # keeps no per-request state

    def sleep(self) -> Freed:
        return Freed()                                       # holds no device memory

    def wake(self) -> None:
        pass
