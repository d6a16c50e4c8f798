"""The feed-forward blocks: a gated MLP (SwiGLU or GeGLU) and a sparse mixture of experts.

Both take the layer's normed hidden states x [T, H] and return [T, H]. The gated MLP's
down projection is row-parallel: its partial sums meet in one all-reduce. The experts
run on one rank (spec/architectures.py refuses tensor parallelism for them).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from kernels.moe import moe_experts, route
from runtime.core.config import MoEConfig
from runtime.load.quantization import linear
from runtime.lora.weights import LayerLora
from runtime.tensor_parallel.shards import TensorParallel


class GatedMLP:
    """down(act_and_mul(gate_up(x))); act_and_mul: the KernelSet's silu_and_mul or gelu_and_mul."""

    def __init__(self, act_and_mul: Callable[[torch.Tensor], torch.Tensor], ops: Any, tp: TensorParallel):
        self.act_and_mul, self.ops, self.tp = act_and_mul, ops, tp

    def __call__(self, x: torch.Tensor, layer: Any, lora: Optional[LayerLora] = None) -> torch.Tensor:
        gate_up = linear(x, layer.gate_up, None, self.ops)
        gated = self.act_and_mul(gate_up if lora is None else lora.add("gate_up", gate_up, x))     # [T, I]
        down = linear(gated, layer.down, None, self.ops)
        return self.tp.all_reduce(down if lora is None else lora.add("down", down, gated))


class SparseMoE:
    """The router picks top_k experts per token (kernels/moe.py:route); each chosen expert,
    a SwiGLU MLP, runs over all of its tokens at once (kernels/moe.py:moe_experts)."""

    def __init__(self, config: MoEConfig):
        self.config = config

    def __call__(self, x: torch.Tensor, layer: Any) -> torch.Tensor:
        router_logits = F.linear(x, layer.router)                              # [T, E]
        weights, expert_ids = route(router_logits, self.config.top_k, self.config.normalize_top_k)
        return moe_experts(x, layer.experts_gate_up, layer.experts_down, weights, expert_ids)
