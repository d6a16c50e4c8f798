"""Sleep and wake of a loaded replica: what is released, what is kept, and how long the
way back takes; torch-free (the model runner does the moving).

A sleeping replica keeps its process, its tokenizer and its weights; it gives back the
device. Sleep (only with no request in the engine) drops the prefix cache (its blocks
live in the KV cache), frees the KV cache, and on CUDA moves every weight tensor to
pinned host memory (runtime/engine/model_runner.py: WeightOffload); on the CPU the
weights are already in host memory and stay where they are. Wake moves the weights
back and allocates a fresh, zeroed KV cache, timed by stage like a load
(runtime/load/timings.py):

  weights    every weight tensor host -> device (`weight_bytes` of them; 0 on the CPU)
  kv_cache   the paged KV cache allocated again

A model with a speculative draft model sleeps and wakes both.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Freed:
    """What one sleep released, summed over tensor-parallel ranks and a draft model."""
    weight_bytes: int = 0          # device bytes of weights moved to host memory (0 on the CPU)
    kv_cache_bytes: int = 0        # the KV cache, freed
    host_bytes: int = 0            # weight bytes held in host memory while asleep

    def __add__(self, other: "Freed") -> "Freed":
        return Freed(self.weight_bytes + other.weight_bytes, self.kv_cache_bytes + other.kv_cache_bytes,
                     self.host_bytes + other.host_bytes)

    @property
    def device_bytes(self) -> int:
        return self.weight_bytes + self.kv_cache_bytes


class NotIdle(RuntimeError):
    """Sleep was asked of an engine that still holds requests."""
