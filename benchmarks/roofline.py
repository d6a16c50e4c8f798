"""The compute roofline of a generation workload: every FLOP it needs, and the machine's
GEMM rate to do them at, so a throughput benchmark can print what share it reached.

FLOPs (multiply-adds count 2) of a dense decoder, per token through one layer: the
projections (q, k, v, o and the gated MLP's three matrices) and attention's two
products over the tokens before it (QK^T and AV, each 2 x context x heads x head_dim).
A prompt token goes through every layer; so does each output token but the last (its
successor is never computed); the LM head runs once per output token (the first from
the prompt's last position). Embedding lookups, norms, rotary and sampling are not
counted: they are not GEMMs and are small beside them.

The rate is measured, not taken from a datasheet: the best of a few runs of the
engine's own fp32 linear (kernels/cpu/linear.py, oneDNN with the weight prepacked) on
a prefill-sized GEMM, with the benchmark's thread count. Pure counting is
`workload_flops`; `gemm_flops_per_s` is the one timed part.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class DecoderShape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def of(cls, config) -> "DecoderShape":      # a runtime.core.config.ModelConfig
        return cls(config.hidden_size, config.intermediate_size, config.num_hidden_layers,
                   config.num_attention_heads, config.num_key_value_heads, config.head_dim,
                   config.vocab_size)

    @property
    def layer_weights(self) -> int:
        q_and_o = 2 * self.hidden * self.heads * self.head_dim
        k_and_v = 2 * self.hidden * self.kv_heads * self.head_dim
        return q_and_o + k_and_v + 3 * self.hidden * self.intermediate

    def token_flops(self, context: int) -> int:
        """One token through every layer, attending to `context` tokens (itself included)."""
        attention = 2 * 2 * context * self.heads * self.head_dim
        return self.layers * (2 * self.layer_weights + attention)

    @property
    def head_flops(self) -> int:
        return 2 * self.hidden * self.vocab


def workload_flops(shape: DecoderShape, prompt_lens: Sequence[int], output_lens: Sequence[int]) -> int:
    total = 0
    for prompt, output in zip(prompt_lens, output_lens):
        fed = prompt + max(0, output - 1)            # the last output token is never fed back
        total += sum(shape.token_flops(position + 1) for position in range(fed))
        total += output * shape.head_flops
    return total


def gemm_flops_per_s(hidden: int, intermediate: int, rows: int = 512, trials: int = 5) -> float:
    """The engine's fp32 linear on a [rows, hidden] x [hidden, intermediate] GEMM: best of
    `trials`, each long enough (~0.2 s) to time."""
    import torch

    from kernels.cpu.linear import linear, pack

    x = torch.randn(rows, hidden)
    weight = pack(torch.randn(intermediate, hidden))
    flops = 2 * rows * hidden * intermediate
    linear(x, weight)
    repeat = max(1, int(0.2 / _seconds(lambda: linear(x, weight))))
    best = min(_seconds(lambda: [linear(x, weight) for _ in range(repeat)]) / repeat
               for _ in range(trials))
    return flops / best


def _seconds(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started
