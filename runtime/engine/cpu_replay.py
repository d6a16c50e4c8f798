"""Decode steps on the CPU replayed from a recording of their C kernel calls (engine
option `cpu_replay`, on by default).

At batch 1 a small model's decode step is a few hundred C kernel calls of a few to a
hundred microseconds each, and the Python around them (wrappers, checks, allocations,
views) costs about a third of the step. As a CUDA graph does on a GPU
(runtime/engine/cuda_graphs.py), a replay records once what the layers do and from then
on only does it again:

- record: the first decode step of n sequences (1 <= n <= MAX_ROWS) runs eagerly over
  static input buffers while kernels/cpu/tape.py's tape notes every C call with the
  tensors it was given, kept alive (their memory is what the calls' pointers name);
- verify: the next step of n runs both ways, eagerly and replayed, and the two must agree
  bit for bit. A torch op inside the layers (a torch linear, as fp32 and bf16 weights
  use; a fused projection stitched by torch.cat) is skipped by a replay, whose result
  then differs: replays are off for this engine, and every step runs eagerly as before;
- replay: later steps copy their inputs (embedded rows, cos and sin, slots, block tables,
  context lengths) into the recorded ones and make the recorded calls again.

Only the layers are replayed: the embedding, the final norm and the logits run eagerly
around them. A replay lives as long as the weights and the KV cache it points into: the
runner drops it with them (sleep). Prefills, mixed batches, speculative verification and
batches above MAX_ROWS run eagerly (cuda_graphs.replay_size decides).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

import torch

from kernels.cpu.tape import Tape, recording
from runtime.engine.cuda_graphs import StaticDecode, replay_size
from runtime.models.batch import ForwardBatch

log = logging.getLogger(__name__)

# Up to this many sequences a step's Python is a large share of it; from there on the
# kernels' arithmetic dwarfs it.
MAX_ROWS = 8


@dataclass
class Recorded:
    """One batch size's recording: its inputs, its calls and its outputs."""
    static: StaticDecode
    hidden: torch.Tensor                                   # the layers' input rows
    cos_sin: dict[Any, tuple[torch.Tensor, torch.Tensor]]  # per rope, as the layers read them
    tape: Tape                                             # the calls, and the tensors they name
    out: tuple[torch.Tensor, torch.Tensor]                 # the last layer's output, the residual
    verified: bool = False


class ReplayFailed(RuntimeError):
    """A replayed kernel reported an error (its status), which eagerly it would have raised."""


class DecodeReplays:
    """model: the DecoderModel (layer_inputs, run_layers, final_hidden, logits); max_blocks:
    the widest block table a sequence can have."""

    def __init__(self, model: Any, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], max_blocks: int,
                 block_size: int):
        self.model, self.kv_caches = model, kv_caches
        self.max_blocks, self.block_size = max_blocks, block_size
        self.sizes = tuple(range(1, MAX_ROWS + 1))
        self.recorded: dict[int, Recorded] = {}
        self.enabled = True
        self.replayed = 0            # steps a replay ran (not counting a verification's)

    def run(self, input_ids: torch.Tensor, batch: ForwardBatch) -> Optional[torch.Tensor]:
        """Logits of the batch's logits_indices rows, as the eager step computes them;
        None when this batch runs eagerly (the caller runs it)."""
        # adapters' deltas are added to the projections by torch, which a replay would skip
        replayable = self.enabled and batch.lora_slots is None
        size = replay_size(int(input_ids.shape[0]), batch, self.sizes, self.max_blocks) if replayable else None
        if size is None:
            return None
        rec = self.recorded.get(size)
        if rec is None:
            rec, logits = self._record(size, input_ids, batch)
            if self.enabled:
                self.recorded[size] = rec
            return logits
        if rec.verified:
            self.replayed += 1
            return self._replay(rec, input_ids, batch)
        return self._verify(size, rec, input_ids, batch)

    def _record(self, size: int, input_ids: torch.Tensor, batch: ForwardBatch) -> tuple[Recorded, torch.Tensor]:
        static = StaticDecode.allocate(size, self.max_blocks, "cpu")
        static_batch = self._stage(static, input_ids, batch)
        hidden, cos_sin = self.model.layer_inputs(input_ids, static_batch)
        with recording(Tape()) as tape:
            out = self.model.run_layers(hidden, cos_sin, static_batch, self.kv_caches)
        rec = Recorded(static, hidden, cos_sin, tape, out)
        return rec, self._logits(rec, batch)

    def _verify(self, size: int, rec: Recorded, input_ids: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """This step replayed, then eagerly: a replay that is wrong writes wrong k and v
        into this step's slots, which the eager step then writes again, right."""
        replayed = self._replay(rec, input_ids, batch)
        eager = self.model.logits(self.model.forward(input_ids, batch, self.kv_caches))
        if torch.equal(replayed, eager):
            rec.verified = True
        else:
            log.info("decode steps run eagerly: a replay of %d sequence(s) differs from the eager "
                     "step (the layers compute with torch besides the C kernels)", size)
            self.enabled, self.recorded = False, {}
        return eager

    def _replay(self, rec: Recorded, input_ids: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        hidden, cos_sin = self.model.layer_inputs(input_ids, self._stage(rec.static, input_ids, batch))
        rec.hidden.copy_(hidden)
        for rope, (cos, sin) in cos_sin.items():
            rec.cos_sin[rope][0].copy_(cos)
            rec.cos_sin[rope][1].copy_(sin)
        for call in rec.tape.calls:
            status = call()
            if status:
                raise ReplayFailed(f"replayed kernel {call.fn.__name__} returned {status}")
        return self._logits(rec, batch)

    def _stage(self, static: StaticDecode, input_ids: torch.Tensor, batch: ForwardBatch) -> ForwardBatch:
        """The batch's inputs in `static`, checked as the attention kernel's wrapper checks
        them (a replay has no wrapper in front of the C code)."""
        n = static.fill(input_ids, batch)                # replay_size sent only decode batches
        lens = static.lens[:n]
        if not 1 <= int(lens.min()) <= int(lens.max()) <= self.max_blocks * self.block_size:
            raise ValueError("decode replay: context_lens must be in [1, max_blocks * block_size]")
        return static.batch(n)

    def _logits(self, rec: Recorded, batch: ForwardBatch) -> torch.Tensor:
        return self.model.logits(self.model.final_hidden(*rec.out, batch))
