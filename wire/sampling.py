"""Per-request sampling parameters, validated before they reach the engine."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional

from wire.response_format import StructuredOutput


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
    # issue 17: parallel samples and logits processors (applied by runtime/engine/penalties.py)
    n: int = 1                          # samples of the one prompt, sharing its KV blocks
    presence_penalty: float = 0.0       # OpenAI's: minus this once a token appeared in the output
    frequency_penalty: float = 0.0      # OpenAI's: minus this per time it appeared
    repetition_penalty: float = 1.0     # CTRL's (HF): divide (or multiply if < 0) seen tokens' logits
    logit_bias: dict[int, float] = field(default_factory=dict)   # token id -> added to its logit
    min_p: float = 0.0                  # drop tokens below min_p * the top token's probability
    min_tokens: int = 0                 # EOS and stop_token_ids are masked until this many
    # issue 17: the grammar the output must match (wire/response_format.py), enforced by
    # runtime/engine/structured_output.py
    structured_output: Optional[StructuredOutput] = None

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
        check_processors(self, vocab_size)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def processes_logits(self) -> bool:
        """Whether any logits processor of issue 17 changes this request's logits."""
        return self.processor_in_use is not None

    @property
    def processor_in_use(self) -> Optional[str]:
        """The first field asking for a logits processor, None when none does."""
        neutral = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
                   "logit_bias": {}, "min_p": 0.0, "min_tokens": 0}
        return next((name for name, value in neutral.items() if getattr(self, name) != value),
                    None)


# The request fields of issue 17 that become SamplingParams fields of the same name.
PROCESSOR_FIELDS = frozenset({"n", "presence_penalty", "frequency_penalty", "repetition_penalty",
                              "logit_bias", "min_p", "min_tokens"})


def processor_values(given: dict[str, Any]) -> dict[str, Any]:
    """JSON to SamplingParams: logit_bias's keys are token ids written as strings."""
    bias = given.get("logit_bias")
    if bias is None:
        return {}
    if not isinstance(bias, dict):
        raise ValueError("logit_bias: must be an object of token id -> bias")
    out: dict[int, Any] = {}
    for key, value in bias.items():
        token = str(key)
        if not token.isdigit():
            raise ValueError(f"logit_bias: key {key!r} is not a token id")
        out[int(token)] = value
    return {"logit_bias": out}


MAX_N = 16                 # parallel samples of one prompt: each holds its own KV tail
MAX_LOGIT_BIAS = 100.0     # OpenAI's bound


def check_processors(p: "SamplingParams", vocab_size: Optional[int]) -> None:
    """The issue-17 fields, by OpenAI's bounds (vLLM's for the extensions)."""
    _check_int("n", p.n, minimum=1, maximum=MAX_N)
    for name in ("presence_penalty", "frequency_penalty"):
        _check_range(name, getattr(p, name), -2.0, 2.0)
    _check_number("repetition_penalty", p.repetition_penalty)
    if not 0 < p.repetition_penalty <= 10:
        raise ValueError("repetition_penalty: must be in (0, 10]")
    _check_range("min_p", p.min_p, 0.0, 1.0)
    _check_int("min_tokens", p.min_tokens, minimum=0)   # past max_tokens: length still ends it
    if not isinstance(p.logit_bias, dict):
        raise ValueError("logit_bias: must be an object of token id -> bias")
    for token_id, bias in p.logit_bias.items():
        _check_token("logit_bias", token_id, vocab_size)
        _check_range("logit_bias", bias, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS)


def _check_range(name: str, value: Any, low: float, high: float) -> None:
    _check_number(name, value)
    if not low <= value <= high:
        raise ValueError(f"{name}: must be in [{low:g}, {high:g}]")


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
