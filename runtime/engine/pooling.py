"""Pooling for task "embed": a prompt's final hidden states -> one unit vector.

"last": the last prompt token's state (decoder embedding models: E5-Mistral, GTE-Qwen);
"mean": the average over every prompt token. A prompt split into several chunks
(chunked prefill) is summed chunk by chunk; a preempted one restarts at position 0,
which resets its sum. The vector is L2-normalized, in float32.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import torch
import torch.nn.functional as F


class PooledChunk(Protocol):
    """What the pooler reads of a ScheduledChunk."""
    request_id: str
    token_ids: list[int]
    start: int
    sample: bool             # the prompt's last chunk: the vector is due


class Pooler:
    def __init__(self, method: str):
        self.method = method
        self._sums: dict[str, tuple[torch.Tensor, int]] = {}   # mean: sum and count so far

    def release(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            self._sums.pop(request_id, None)

    def pool(self, hidden: torch.Tensor, chunks: Sequence[PooledChunk]) -> dict[str, list[float]]:
        """hidden [T, H]: the chunks' rows, in chunk order -> vectors of finished prompts."""
        out, row = {}, 0
        for chunk in chunks:
            rows = hidden[row:row + len(chunk.token_ids)].float()
            row += len(chunk.token_ids)
            pooled = self._add(chunk, rows)
            if chunk.sample:
                out[chunk.request_id] = F.normalize(pooled, dim=-1).tolist()
                self._sums.pop(chunk.request_id, None)
        return out

    def _add(self, chunk: PooledChunk, rows: torch.Tensor) -> torch.Tensor:
        if self.method == "last":
            return rows[-1]
        total, count = self._sums.get(chunk.request_id, (None, 0)) if chunk.start else (None, 0)
        total = rows.sum(0) if total is None else total + rows.sum(0)
        count += rows.shape[0]
        self._sums[chunk.request_id] = (total, count)
        return total / count
