"""LlamaForCausalLM and the checkpoints that share its layout: Mistral (a sliding window
when config.json sets one), Qwen2 (q/k/v bias, tied embeddings) and Qwen3 (RMSNorm of
each q and k head). What differs lies in config.json and in which optional weights the
checkpoint holds; the decoder itself is runtime/models/decoder.py.
"""
from __future__ import annotations

import torch

from runtime.models.decoder import DecoderModel, LayerWeights, pre_norms, split_attention, split_mlp


class LlamaModel(DecoderModel):
    def _layer(self, raw: dict[str, torch.Tensor], i: int) -> LayerWeights:
        p = f"model.layers.{i}."
        return LayerWeights(**pre_norms(raw, p), **split_attention(raw, p + "self_attn.", self._norm),
                            **split_mlp(raw, p + "mlp."))
