"""Phi3ForCausalLM (Phi-3, Phi-3.5, Phi-4-mini): a Llama-style decoder whose checkpoint
stores q/k/v as one qkv_proj and gate/up as one gate_up_proj, already in the fused
layout the decoder runs (q rows, then k, then v; gate rows, then up). Partial rotary
and LongRoPE come from config.json (runtime/models/rope.py).
"""
from __future__ import annotations

import torch

from runtime.models.decoder import DecoderModel, LayerWeights, pre_norms


class Phi3Model(DecoderModel):
    def _layer(self, raw: dict[str, torch.Tensor], i: int) -> LayerWeights:
        p = f"model.layers.{i}."
        return LayerWeights(**pre_norms(raw, p), qkv=raw.pop(p + "self_attn.qkv_proj.weight"),
                            o=raw.pop(p + "self_attn.o_proj.weight"),
                            gate_up=raw.pop(p + "mlp.gate_up_proj.weight"),
                            down=raw.pop(p + "mlp.down_proj.weight"))
