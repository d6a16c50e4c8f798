"""Gemma 2 and 3 beyond the shared exactness tests: what config.json says (old and new
layouts), Gemma 3's two ropes against transformers, norms stored as w - 1."""
from __future__ import annotations

import torch

from runtime.core.config import ModelConfig
from runtime.models.rope import make_rotary, rope_inv_freq

GEMMA3_OLD_STYLE = dict(
    architectures=["Gemma3ForCausalLM"], hidden_size=1152, intermediate_size=6912, num_hidden_layers=8,
    num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
    hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=256, sliding_window=512,
    sliding_window_pattern=6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
    rope_scaling={"rope_type": "linear", "factor": 8.0}, final_logit_softcapping=None,
    attn_logit_softcapping=None)


def test_gemma2_config(arch_model):
    config = ModelConfig.from_dir(arch_model("gemma2"))
    assert config.layer_windows == (16, None)          # sliding, then global
    assert config.kv_window is None                    # a global layer reads every block
    assert (config.attn_logit_softcap, config.final_logit_softcap) == (5.0, 10.0)
    assert config.query_pre_attn_scalar == 32 and config.hidden_act == "gelu_tanh"


def test_gemma3_config_without_layer_types_follows_its_pattern():
    config = ModelConfig.from_dict(GEMMA3_OLD_STYLE)
    assert config.layer_windows == (512,) * 5 + (None,) + (512,) * 2
    assert config.local_rope_theta == 10000.0 and config.rope_theta == 1000000.0
    assert config.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert config.attn_logit_softcap is None           # transformers' Gemma 3 never caps scores


def test_gemma3_ropes_equal_transformers(arch_model, hf_oracle):
    path = arch_model("gemma3")
    config = ModelConfig.from_dir(path)
    hf_rotary = hf_oracle(path).model.rotary_emb
    assert torch.equal(rope_inv_freq(config), hf_rotary.full_attention_inv_freq)
    assert torch.equal(make_rotary(config, "cpu", local=True).inv_freq, hf_rotary.sliding_attention_inv_freq)


def test_norm_weights_are_loaded_one_up(arch_model, hf_oracle):
    from runtime import LLM

    path = arch_model("gemma3")
    layer = LLM(str(path), kv_cache_tokens=64).engine.runner.model.layers[1]
    hf_layer = hf_oracle(path).model.layers[1]
    assert torch.equal(layer.mlp_out_norm, hf_layer.post_feedforward_layernorm.weight + 1)
    assert torch.equal(layer.k_norm, hf_layer.self_attn.k_norm.weight + 1)
