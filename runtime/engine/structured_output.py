"""Structured outputs in the engine: one grammar matcher per request, token masks per step.

The grammar (wire/response_format.py: llguidance's format) is compiled against this
model's tokenizer when the request is added (`check`: an error is a ValueError naming the
field, so a 400). Every step, for the batch's sampled rows that carry a grammar,
`start` computes the allowed-token bitmask on a helper thread while the model runs its
forward pass (llguidance releases the GIL and spreads the batch over its own threads);
the sampler waits for it after the forward and applies it to the logits
(`TokenMask.apply`: disallowed tokens to -inf), so rows without a grammar are untouched.
After sampling, `advance` feeds each sampled token to its request's matcher.

Requests get a matcher on first use, copied from a compiled template cached per grammar,
so the n samples of one prompt each get their own. A matcher that has seen the whole
grammar allows only EOS; one in an error state (a token it refused: cannot come from a
masked row) also allows only EOS, so the request ends instead of drifting.
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from wire.response_format import StructuredOutput
from wire.sampling import SamplingParams

if TYPE_CHECKING:
    import torch


@dataclass
class MaskTimes:
    mask_s: float = 0.0     # computing masks (on the helper thread, overlapping the forward)
    wait_s: float = 0.0     # the sampler waiting for them after the forward: their real cost


@dataclass
class TokenMask:
    """Allowed tokens of some logits rows: bitmask [R, ceil(V/32)] int32, bit j of word w
    allows token 32 * w + j; `rows` are the logits rows they belong to."""
    rows: list[int]
    bitmask: np.ndarray

    def apply(self, logits: "torch.Tensor") -> "torch.Tensor":
        """logits [N, V] -> the same with disallowed tokens at -inf (in place)."""
        import torch   # the sampler's; this module stays importable without torch

        vocab = logits.shape[-1]
        allowed = np.unpackbits(self.bitmask.view(np.uint8), axis=1, bitorder="little")[:, :vocab]
        index = torch.tensor(self.rows, device=logits.device)
        refused = torch.from_numpy(allowed == 0).to(logits.device)
        logits[index] = logits[index].masked_fill(refused, float("-inf"))
        return logits


class PendingMasks:
    """The masks of one step's sampled chunks, being computed; `take` waits for them."""

    def __init__(self, chunk_ids: list[str], bitmask: np.ndarray, done: Optional[Future[None]],
                 guided: set[str], times: MaskTimes):
        self._row = {request_id: i for i, request_id in enumerate(chunk_ids)}
        self._bitmask, self._done, self._guided, self._times = bitmask, done, guided, times

    def take(self, chunk_ids: Sequence[str]) -> Optional[TokenMask]:
        """The mask for logits whose row r belongs to chunk `chunk_ids[r]` (forks repeat
        their chunk's id); None when no row has a grammar."""
        rows = [r for r, request_id in enumerate(chunk_ids) if request_id in self._guided]
        if not rows:
            return None
        if self._done is not None:
            started = time.perf_counter()
            self._done.result()
            self._times.wait_s += time.perf_counter() - started
        index = [self._row[chunk_ids[r]] for r in rows]
        return TokenMask(rows, self._bitmask[index])


class StructuredOutputs:
    """The matchers of one engine. `model_dir` holds tokenizer.json; `vocab_size` is the
    model's (logits width); `eos_token_ids` end a request (what a finished grammar allows)."""

    def __init__(self, model_dir: str | Path, vocab_size: int, eos_token_ids: Sequence[int]):
        self._tokenizer_path = Path(model_dir) / "tokenizer.json"
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self._matchers: dict[str, Any] = {}
        self._tokenizer: Any = None
        self._executor: Any = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
        self._templates = lru_cache(maxsize=256)(self._compile)
        self.times = MaskTimes()

    # ---- when a request is added

    def check(self, params: SamplingParams) -> None:
        """Compile the request's grammar for this tokenizer (cached); ValueError naming the field."""
        if params.structured_output is not None:
            self._templates(params.structured_output)

    def _compile(self, output: StructuredOutput) -> Any:
        import llguidance

        matcher = llguidance.LLMatcher(self._llg_tokenizer(), output.grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"{output.field}: {' '.join(matcher.get_error().split())[:300]}")
        return matcher

    def _llg_tokenizer(self) -> Any:
        """Built on first use (~0.4 s for a 49k vocabulary), so cold starts don't pay for it."""
        if self._tokenizer is None:
            import llguidance

            try:
                self._tokenizer = llguidance.LLTokenizer(
                    self._tokenizer_path.read_text(), n_vocab=self.vocab_size, eos_token=self.eos_token_ids)
            except (OSError, ValueError) as exc:
                raise ValueError(f"response_format: structured outputs are not available for this "
                                 f"model's tokenizer ({exc})") from None
            self._executor = llguidance.LLExecutor()
        return self._tokenizer

    # ---- every step

    def start(self, chunk_ids: list[str], params: list[SamplingParams]) -> PendingMasks:
        """Begin computing the masks of these sampled chunks (one row each) in the background."""
        width = (self.vocab_size + 31) // 32
        guided = [(self._matcher(i, p.structured_output), row) for row, (i, p) in enumerate(zip(chunk_ids, params))
                  if p.structured_output is not None]
        bitmask = np.full((len(chunk_ids), width), -1, dtype=np.int32)
        ids = {chunk_ids[row] for _, row in guided}
        done = self._thread.submit(self._fill, guided, bitmask) if guided else None
        return PendingMasks(chunk_ids, bitmask, done, ids, self.times)

    def _fill(self, guided: list[tuple[Any, int]], bitmask: np.ndarray) -> None:
        started = time.perf_counter()
        healthy = [(m, row) for m, row in guided if not m.is_error()]
        if healthy:
            self._executor.unsafe_compute_mask_ptr(healthy, bitmask.ctypes.data, bitmask.shape[1] * 4,
                                                   bitmask.shape[0])
        for m, row in guided:
            if m.is_error():
                bitmask[row] = _only(self.eos_token_ids, bitmask.shape[1])
        self.times.mask_s += time.perf_counter() - started

    def advance(self, request_ids: Sequence[str], params: Sequence[SamplingParams],
                tokens: Sequence[int]) -> None:
        """Each sampled token to its request's matcher (forks get theirs on first use)."""
        for request_id, p, token in zip(request_ids, params, tokens):
            if p.structured_output is not None:
                self._matcher(request_id, p.structured_output).consume_token(token)

    def release(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            self._matchers.pop(request_id, None)

    def _matcher(self, request_id: str, output: StructuredOutput) -> Any:
        matcher = self._matchers.get(request_id)
        if matcher is None:
            matcher = self._matchers[request_id] = self._templates(output).deep_copy()
        return matcher


def _only(token_ids: Sequence[int], width: int) -> np.ndarray:
    """A bitmask row allowing just these tokens."""
    row = np.zeros(width, dtype=np.uint32)
    for token in token_ids:
        row[token // 32] |= np.uint32(1 << (token % 32))
    return row.view(np.int32)
