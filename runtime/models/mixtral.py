"""The sparse mixture-of-experts members of the Llama family: MixtralForCausalLM (top-2 of 8
experts per token) and Qwen3MoeForCausalLM (q/k norms, top-k of many smaller experts,
some layers optionally dense). Attention is Llama's; the MLP is runtime/models/mlp.py's
SparseMoE, its experts stacked at load into [E, 2I, H] and [E, H, I].
"""
from __future__ import annotations

import torch

from runtime.core.config import ModelConfig
from runtime.models.decoder import DecoderModel, LayerWeights, pre_norms, split_attention, split_mlp


class MixtralModel(DecoderModel):
    def _layer(self, raw: dict[str, torch.Tensor], i: int) -> LayerWeights:
        p = f"model.layers.{i}."
        moe = p + "block_sparse_moe."
        return LayerWeights(**pre_norms(raw, p), router=raw.pop(moe + "gate.weight"),
                            **split_attention(raw, p + "self_attn.", self._norm),
                            **stacked_experts(raw, moe + "experts.", self.config, ("w1", "w3", "w2")))


class Qwen3MoeModel(DecoderModel):
    def _layer(self, raw: dict[str, torch.Tensor], i: int) -> LayerWeights:
        p = f"model.layers.{i}."
        dense = self.config.moe is None or i in self.config.moe.dense_layers
        names = ("gate_proj", "up_proj", "down_proj")
        mlp = split_mlp(raw, p + "mlp.") if dense else dict(
            router=raw.pop(p + "mlp.gate.weight"), **stacked_experts(raw, p + "mlp.experts.", self.config, names))
        return LayerWeights(**pre_norms(raw, p), **split_attention(raw, p + "self_attn.", self._norm), **mlp)


def stacked_experts(raw: dict[str, torch.Tensor], p: str, config: ModelConfig,
                    names: tuple[str, str, str]) -> dict[str, torch.Tensor]:
    """experts_gate_up [E, 2I, H] and experts_down [E, H, I] from the per-expert weights
    p + "{e}.{name}.weight", names: the checkpoint's (gate, up, down)."""
    assert config.moe is not None
    take = [[raw.pop(f"{p}{e}.{n}.weight") for n in names] for e in range(config.moe.num_experts)]
    return dict(experts_gate_up=torch.stack([torch.cat([gate, up]) for gate, up, _ in take]),
                experts_down=torch.stack([down for _, _, down in take]))
