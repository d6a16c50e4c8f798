"""Gemma2ForCausalLM and Gemma3ForCausalLM (the text model).

On top of the shared decoder: embeddings scaled by sqrt(hidden_size); RMSNorm weights
stored as w - 1 (the offset is added back at load, so the kernels' norm applies them);
a norm after attention and after the MLP as well as before each; GeGLU. From
config.json: sliding-window and global layers alternating (Gemma 2 every other layer,
Gemma 3 five local to one global, with their own rope base), query_pre_attn_scalar for
the attention scale, soft caps of the attention scores (Gemma 2) and of the logits.
Gemma 3 adds q/k norms.
"""
from __future__ import annotations

import torch

from runtime.models.decoder import DecoderModel, LayerWeights, split_attention, split_mlp


class GemmaModel(DecoderModel):
    scaled_embedding = True
    norm_offset = 1.0

    def _layer(self, raw: dict[str, torch.Tensor], i: int) -> LayerWeights:
        p = f"model.layers.{i}."
        return LayerWeights(attn_norm=self._norm(raw, p + "input_layernorm.weight"),
                            attn_out_norm=self._norm(raw, p + "post_attention_layernorm.weight"),
                            mlp_norm=self._norm(raw, p + "pre_feedforward_layernorm.weight"),
                            mlp_out_norm=self._norm(raw, p + "post_feedforward_layernorm.weight"),
                            **split_attention(raw, p + "self_attn.", self._norm),
                            **split_mlp(raw, p + "mlp."))
