"""The device's adapter slots: for each layer, the stacked A and B of every slot for each
of the engine's projections (fused q/k/v and gate/up included), and the delta a batch's
tokens get from their adapters.

A fused projection's adapter is one block-diagonal pair: q, k and v (or gate and up) each
keep their own A rows and their own B columns, so one shrink and one expand give every
part its delta: A [parts * R, K] stacks the parts' A, B [parts * R, N] puts each part's B
(transposed: kernels/lora.py's layout) in its rows and its columns. A slot holds one
adapter, zero-padded to the slots' rank R and zeros wherever it targets nothing (a zero
delta).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable
import torch

from runtime.core.config import ModelConfig
from runtime.lora.adapter import LoraAdapter, base_dims

# the engine's projections: the PEFT modules each one fuses, in the order of its rows
PROJECTIONS = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",),
               "gate_up": ("gate_proj", "up_proj"), "down": ("down_proj",)}


@dataclass
class LoraStack:
    a: torch.Tensor        # [slots, parts * R, K]
    b: torch.Tensor        # [slots, parts * R, N]
    splits: tuple[int, ...]   # each part's output size (q, k, v): kernels/lora.py skips the zeros


class LoraWeights:
    def __init__(self, config: ModelConfig, num_slots: int, max_rank: int, device: str):
        self.max_rank = max_rank
        shapes = base_dims(config).module_shapes()
        self.layers: list[dict[str, LoraStack]] = []
        for _ in range(config.num_hidden_layers):
            stacks = {}
            for projection, modules in PROJECTIONS.items():
                out = sum(shapes[m][0] for m in modules)
                width = len(modules) * max_rank
                stacks[projection] = LoraStack(
                    a=torch.zeros(num_slots, width, shapes[modules[0]][1], device=device),
                    b=torch.zeros(num_slots, width, out, device=device),
                    splits=tuple(shapes[m][0] for m in modules))
            self.layers.append(stacks)

    def load(self, slot: int, adapter: LoraAdapter) -> None:
        """Copy `adapter` into `slot`, zeros wherever it targets nothing."""
        r = self.max_rank
        for layer, stacks in enumerate(self.layers):
            for projection, modules in PROJECTIONS.items():
                stack = stacks[projection]
                stack.a[slot].zero_()
                stack.b[slot].zero_()
                for part, module in enumerate(modules):
                    found = adapter.weights.get((layer, module))
                    if found is None:
                        continue
                    a, b = found
                    first = sum(stack.splits[:part])              # the part's output rows
                    rows = slice(first, first + stack.splits[part])
                    stack.a[slot, part * r:part * r + adapter.rank].copy_(a)
                    stack.b[slot, part * r:part * r + adapter.rank, rows].copy_(b.T)


@dataclass
class LayerLora:
    """One layer's slots and the batch's tokens' slots (-1: the base model); delta: the
    kernel set's lora_delta (kernels/lora.py has the contract)."""
    stacks: dict[str, LoraStack]
    slots: torch.Tensor            # [T] long
    delta: Callable[..., torch.Tensor]

    def add(self, projection: str, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """`projection`'s output `out` of x, plus each token's adapter delta."""
        stack = self.stacks[projection]
        delta = self.delta(x.reshape(-1, x.shape[-1]), stack.a, stack.b, self.slots, stack.splits)
        # in place: `out` is the projection's own fresh output
        return out.add_(delta.view(out.shape).to(out.dtype))
