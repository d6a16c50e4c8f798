"""CUDA graphs of the decode step (engine option `cuda_graphs`, default off).

A decode step at batch 1-64 on a GPU is mostly kernel launches: one per op per layer,
each a few microseconds of CPU for a few microseconds of GPU. A graph records the whole
forward and the logits once per batch size and replays them with one launch, as vLLM and
SGLang do. What a graph needs, and this module provides:

- fixed shapes: a batch of n decoding sequences runs the graph of the smallest captured
  size >= n (`graph_batch_size`), its rows past n padding; the block tables are as wide
  as the longest sequence the replica allows (`replay_size` decides, `stage` fills);
- fixed addresses: inputs are copied into static buffers before each replay, and the
  logits come back in the graph's own output buffer (the rows the batch samples are
  read out of it before the next step: a one-token chunk of a prompt samples nothing);
- harmless padding: a padding row decodes token 0 at position 0 with a context of one
  token whose k/v slot is in a scratch block the block manager never hands out.

Prefill, chunked prefill, speculative verification (several rows per sequence) and
batches larger than the largest graph run eagerly. Only one rank (no tensor parallel
collectives inside a graph) and no mixture of experts (`require_capturable`). It has
never run on a GPU: `make gpu-check` (`cuda_graphs_decode`) compares it with the eager
engine and prints the speedup; the option stays off by default until that check has
passed on one. `stage` and `step` run on any device, so the tests check on the CPU
what a replay computes.
"""
from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from runtime.models.batch import DecodeMeta, ForwardBatch

log = logging.getLogger(__name__)

CAPTURE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def require_capturable(backend: str, experts: bool) -> None:
    """ValueError unless the decode step can be recorded in a graph: the Triton set's
    decode attention reads the block tables on the device, the references' reads them on
    the host (`.tolist()`), which a capture refuses; a mixture of experts (`experts`)
    counts each expert's tokens on the host too (kernels/moe.py). Asked before the
    weights load."""
    if backend != "triton":
        raise ValueError(f"cuda_graphs: needs the Triton kernels (this process has the {backend!r} set: "
                         "is triton installed?); the reference decode attention cannot be captured")
    if experts:
        raise ValueError("cuda_graphs: a mixture-of-experts model cannot be captured (its expert dispatch "
                         "reads token counts on the host); serve it without cuda_graphs")


def capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """The batch sizes to capture: CAPTURE_SIZES up to the first >= max_num_seqs (larger
    decode batches run eagerly: launches matter less there)."""
    cap = next((s for s in CAPTURE_SIZES if s >= max_num_seqs), CAPTURE_SIZES[-1])
    return tuple(s for s in CAPTURE_SIZES if s <= cap)


def graph_batch_size(rows: int, sizes: Sequence[int]) -> Optional[int]:
    """The smallest captured size that holds `rows` decoding sequences (None: none does)."""
    i = bisect.bisect_left(sizes, rows)
    return sizes[i] if rows >= 1 and i < len(sizes) else None


def replay_size(rows: int, batch: ForwardBatch, sizes: Sequence[int], max_blocks: int) -> Optional[int]:
    """The captured size whose graph runs a batch of `rows` input rows; None where it runs
    eagerly: a prefill in it, no decode rows, rows that are not one per sequence, more
    rows than the largest graph, or block tables wider than the captured ones."""
    decode = batch.decode
    if batch.prefill is not None or decode is None:
        return None
    tables_rows, width = decode.block_tables.shape
    if rows != tables_rows or width > max_blocks:
        return None
    return graph_batch_size(rows, sizes)


@dataclass
class StaticDecode:
    """Input buffers of a recorded decode step, `rows` sequences at most: a replay reads
    its inputs from these addresses (runtime/engine/cpu_replay.py uses them too)."""
    input_ids: torch.Tensor           # [B] long
    positions: torch.Tensor           # [B] long
    slots: torch.Tensor               # [B] long
    tables: torch.Tensor              # [B, max_blocks] int32
    lens: torch.Tensor                # [B] int32
    rows: torch.Tensor                # [B] long: 0..B-1, the logits rows

    @classmethod
    def allocate(cls, rows: int, max_blocks: int, device: str, scratch_block: int = 0,
                 block_size: int = 1) -> "StaticDecode":
        """Every row decoding token 0 at position 0 into slot 0 of `scratch_block`."""
        return cls(input_ids=torch.zeros(rows, dtype=torch.long, device=device),
                   positions=torch.zeros(rows, dtype=torch.long, device=device),
                   slots=torch.full((rows,), scratch_block * block_size, dtype=torch.long, device=device),
                   tables=torch.full((rows, max_blocks), scratch_block, dtype=torch.int32, device=device),
                   lens=torch.ones(rows, dtype=torch.int32, device=device),
                   rows=torch.arange(rows, dtype=torch.long, device=device))

    def fill(self, input_ids: torch.Tensor, batch: ForwardBatch) -> int:
        """Copy a decode batch of n sequences into the first n rows; n."""
        decode = batch.decode
        assert decode is not None, "only a decode batch is copied in"
        n = int(input_ids.shape[0])
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(batch.positions, non_blocking=True)
        self.slots[:n].copy_(batch.slot_mapping, non_blocking=True)
        self.tables[:n, :decode.block_tables.shape[1]].copy_(decode.block_tables, non_blocking=True)
        self.lens[:n].copy_(decode.context_lens, non_blocking=True)
        return n

    def batch(self, size: int) -> ForwardBatch:
        return ForwardBatch(positions=self.positions[:size], slot_mapping=self.slots[:size],
                            logits_indices=self.rows[:size],
                            decode=DecodeMeta(block_tables=self.tables[:size], context_lens=self.lens[:size]))


class DecodeGraphs:
    """model: the DecoderModel; scratch_block: a KV block index no request is given."""

    def __init__(self, model: Any, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], device: str,
                 sizes: Sequence[int], max_blocks: int,
                 scratch_block: int, block_size: int):
        self.model, self.kv_caches, self.device = model, kv_caches, device
        self.sizes = tuple(sorted(sizes))
        self.scratch_block, self.scratch_slot = scratch_block, scratch_block * block_size
        self.static = StaticDecode.allocate(self.sizes[-1], max_blocks, device, scratch_block, block_size)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    @torch.inference_mode()
    def capture(self) -> None:
        """One graph per size, largest first (the smaller ones reuse its memory pool)."""
        pool = None
        for size in reversed(self.sizes):
            self._pad(0, size)
            batch = self.static.batch(size)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):          # compiles and autotunes outside the capture
                for _ in range(2):
                    self.step(size, batch)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self.step(size, batch)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize(self.device)
        log.info("captured CUDA graphs of the decode step for batch sizes %s", self.sizes)

    def run(self, input_ids: torch.Tensor, batch: ForwardBatch) -> Optional[torch.Tensor]:
        """Logits of the batch's logits_indices rows, as the eager step returns them, through
        a graph; None when the batch is not one a graph can run (the caller runs it eagerly)."""
        size = self.stage(input_ids, batch)
        if size is None:
            return None
        self.graphs[size].replay()
        return self.outputs[size].index_select(0, batch.logits_indices)

    def stage(self, input_ids: torch.Tensor, batch: ForwardBatch) -> Optional[int]:
        """Copy a decode batch into the static buffers, padding after it up to the size of
        the graph that runs it; that size (None: no graph runs it, nothing is copied)."""
        n = int(input_ids.shape[0])
        size = replay_size(n, batch, self.sizes, self.static.tables.shape[1])
        if size is None or batch.decode is None:
            return None
        self.static.fill(input_ids, batch)
        self._pad(n, size)
        return size

    def _pad(self, start: int, stop: int) -> None:
        """Rows start..stop-1 decode token 0 at position 0 into the scratch block."""
        s = self.static
        s.input_ids[start:stop] = 0
        s.positions[start:stop] = 0
        s.slots[start:stop] = self.scratch_slot
        s.tables[start:stop, 0] = self.scratch_block
        s.lens[start:stop] = 1

    def step(self, size: int, batch: ForwardBatch) -> torch.Tensor:
        """What the graph of `size` records: the model's logits of every static row
        (batch: the static buffers' batch of that size)."""
        hidden = self.model.forward(self.static.input_ids[:size], batch, self.kv_caches)
        return self.model.logits(hidden)
