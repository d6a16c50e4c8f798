"""Mixtral and Qwen3-MoE beyond the shared exactness tests: the experts' config and
weights, the engine options refused by name, and the pool sizing every expert."""
from __future__ import annotations

import json
import struct

import pytest

from runtime import LLM
from runtime.core.config import ModelConfig, MoEConfig


def test_moe_configs(arch_model):
    assert ModelConfig.from_dir(arch_model("mixtral")).moe == MoEConfig(
        num_experts=8, top_k=2, intermediate_size=128, normalize_top_k=True)
    assert ModelConfig.from_dir(arch_model("qwen3_moe")).moe == MoEConfig(
        num_experts=8, top_k=2, intermediate_size=48, normalize_top_k=True, dense_layers=(1,))


def test_experts_are_stacked_and_a_dense_layer_kept(arch_model):
    layers = LLM(str(arch_model("qwen3_moe")), kv_cache_tokens=64).engine.runner.model.layers
    assert layers[0].experts_gate_up.shape == (8, 2 * 48, 64) and layers[0].experts_down.shape == (8, 64, 48)
    assert layers[0].router.shape == (8, 64) and layers[0].gate_up is None
    assert layers[1].router is None and layers[1].gate_up is not None


@pytest.mark.parametrize("option,match", [
    (dict(quantization="int8"), "quantization: int8 does not cover MixtralForCausalLM's experts"),
    (dict(tensor_parallel_size=2), "tensor_parallel_size: MixtralForCausalLM runs on one rank only")])
def test_options_the_experts_cannot_take_are_refused_by_name(option, match, arch_model):
    with pytest.raises(ValueError, match=match):
        LLM(str(arch_model("mixtral")), kv_cache_tokens=64, **option)


def test_the_pool_sizes_every_expert(arch_model, hf_oracle):
    """pool/weights/inspection.py sums the safetensors headers: all 8 experts of every layer."""
    from pool.weights.inspection import summarize

    path = arch_model("mixtral")
    raw = (path / "model.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    info = summarize("s3://b/m/", json.loads((path / "config.json").read_text()), ["model.safetensors"],
                     [json.loads(raw[8:8 + length])])
    assert info.num_parameters == sum(p.numel() for p in hf_oracle(path).parameters())
    assert info.weight_bytes == 4 * info.num_parameters
