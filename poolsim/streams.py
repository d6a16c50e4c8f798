"""Many deployments' request streams merged into one, in arrival order, a time window at a time.

Each deployment yields its requests as chunks of numpy arrays in its own time
order. The merge holds a heap of the deployments by their next arrival and,
for each window of simulated time, takes from each deployment only what falls
in the window, sorts that with numpy and yields it: the work per request is a
slice and a sort rather than a heap operation, and memory holds one window.

Ties in time go to the lower deployment index, then to the deployment's own
order, so the stream does not depend on the window's width.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import numpy as np

from poolsim.workload import Request


@dataclass(frozen=True, eq=False, slots=True)
class Chunk:
    """Consecutive requests of one deployment."""
    times: np.ndarray                # float64 [n], seconds, non-decreasing
    prompts: np.ndarray              # int64 [n]
    outputs: np.ndarray              # int64 [n]


class _Cursor:
    """Where the merge stands in one deployment's chunks."""

    def __init__(self, chunks: Iterator[Chunk]) -> None:
        self._chunks = chunks
        self._chunk: Optional[Chunk] = None
        self._at = 0
        self._advance()

    @property
    def next_time(self) -> Optional[float]:
        return None if self._chunk is None else float(self._chunk.times[self._at])

    def take_before(self, end: float) -> list[Chunk]:
        taken = []
        while self._chunk is not None and self._chunk.times[self._at] < end:
            stop = self._at + int(np.searchsorted(self._chunk.times[self._at:], end))
            taken.append(_slice(self._chunk, self._at, stop))
            self._at = stop
            if stop == len(self._chunk.times):
                self._advance()
        return taken

    def _advance(self) -> None:
        self._chunk, self._at = next((c for c in self._chunks if len(c.times)), None), 0


def _slice(chunk: Chunk, start: int, stop: int) -> Chunk:
    return Chunk(chunk.times[start:stop], chunk.prompts[start:stop], chunk.outputs[start:stop])


def merge(names: Sequence[str], sources: Sequence[Iterator[Chunk]], window_s: float = 60.0) -> Iterator[Request]:
    """The requests of all sources (sources[i] is deployment names[i]) in time order."""
    cursors = [_Cursor(source) for source in sources]
    heap = [(c.next_time, i) for i, c in enumerate(cursors) if c.next_time is not None]
    heapq.heapify(heap)
    while heap:
        end = (heap[0][0] // window_s + 1) * window_s
        taken: list[tuple[int, Chunk]] = []
        while heap and heap[0][0] < end:
            _, i = heapq.heappop(heap)
            taken += [(i, chunk) for chunk in cursors[i].take_before(end)]
            following = cursors[i].next_time
            if following is not None:
                heapq.heappush(heap, (following, i))
        yield from _in_order(names, taken)


def _in_order(names: Sequence[str], taken: list[tuple[int, Chunk]]) -> Iterator[Request]:
    times = np.concatenate([chunk.times for _, chunk in taken])
    owners = np.concatenate([np.full(len(chunk.times), i) for i, chunk in taken])
    order = np.lexsort((owners, times))           # by time, then deployment; stable within one
    prompts = np.concatenate([chunk.prompts for _, chunk in taken])[order]
    outputs = np.concatenate([chunk.outputs for _, chunk in taken])[order]
    for at, owner, prompt, output in zip(times[order].tolist(), owners[order].tolist(),
                                         prompts.tolist(), outputs.tolist()):
        yield Request(at, names[owner], prompt, output)
