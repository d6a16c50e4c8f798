"""Per-request sampling parameters, validated before they reach the engine."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                      # 0: no top-k cut
    seed: Optional[int] = None
    stop: Optional[list[str]] = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: Optional[int] = None      # top-N logprobs per generated token

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SamplingParams":
        """Build from untrusted input; unknown fields are refused by name."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown field")
        params = cls(**data)
        params.validate()
        return params

    def validate(self, vocab_size: Optional[int] = None) -> None:
        """Raise ValueError whose message starts with the offending field."""
        _check_int("max_tokens", self.max_tokens, minimum=1)
        _check_number("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError("temperature: must be >= 0")
        _check_number("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p: must be in (0, 1]")
        _check_int("top_k", self.top_k, minimum=0)
        if self.seed is not None:
            _check_int("seed", self.seed, minimum=0)
        if self.stop is not None:
            if isinstance(self.stop, str):
                self.stop = [self.stop]
            if not all(isinstance(s, str) and s for s in self.stop):
                raise ValueError("stop: must be a non-empty string or a list of them")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, minimum=0, maximum=20)
        for token_id in self.stop_token_ids:
            _check_token("stop_token_ids", token_id, vocab_size)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _check_int(name: str, value: Any, minimum: int, maximum: Optional[int] = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: must be an integer")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name}: must be {bound}")


def _check_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: must be a number")


def _check_token(name: str, token_id: Any, vocab_size: Optional[int]) -> None:
    _check_int(name, token_id, minimum=0)
    if vocab_size is not None and token_id >= vocab_size:
        raise ValueError(f"{name}: token id {token_id} outside the vocabulary of {vocab_size}")


def validate_prompt_ids(token_ids: list[int], vocab_size: int, name: str = "prompt") -> None:
    """Token-id prompts are checked against the vocabulary before scheduling."""
    if not token_ids:
        raise ValueError(f"{name}: must not be empty")
    for token_id in token_ids:
        _check_token(name, token_id, vocab_size)
