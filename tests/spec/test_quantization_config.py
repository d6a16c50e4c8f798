"""config.json's quantization_config: the schemes the runtime serves, and a refusal naming
the field for any other."""
from __future__ import annotations

import pytest

from spec.quantization_config import FP8, INT4, INT8, QuantizationScheme, loaded_bytes, scheme


def read(q):
    return scheme({"architectures": ["LlamaForCausalLM"], "quantization_config": q})


def awq(**changes):
    return {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"} | changes


def gptq(**changes):
    return {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True,
            "checkpoint_format": "gptq", "damp_percent": 0.01, "true_sequential": True} | changes


def ct(fmt, weights, inputs=None, **changes):
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": inputs, "output_activations": None}},
            "ignore": ["lm_head"], "kv_cache_scheme": None, "sparsity_config": {}} | changes


W4 = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128,
      "dynamic": False, "actorder": None, "observer": "minmax"}
W8 = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False}
A8 = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
F8 = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor", "dynamic": False}
AF8 = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True}


def test_no_quantization_config_is_none():
    assert scheme({"architectures": ["LlamaForCausalLM"]}) is None
    assert read(None) is None


@pytest.mark.parametrize("group", [32, 64, 128])
def test_awq_gemm(group):
    assert read(awq(group_size=group)) == QuantizationScheme("awq", INT4, "awq", group_size=group, symmetric=False)
    assert read(awq(version="GEMM", zero_point=False)).symmetric


@pytest.mark.parametrize("desc_act", [True, False])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("group", [32, 64, 128, -1])
def test_gptq(desc_act, sym, group):
    s = read(gptq(desc_act=desc_act, sym=sym, group_size=group))
    assert s == QuantizationScheme("gptq", INT4, "gptq", group_size=None if group == -1 else group,
                                   symmetric=sym, act_order=desc_act)


def test_compressed_tensors_schemes():
    assert read(ct("pack-quantized", W4)) == QuantizationScheme("compressed-tensors", INT4, "pack-quantized",
                                                                group_size=128)
    channel = read(ct("pack-quantized", W4 | {"strategy": "channel", "group_size": None, "symmetric": False}))
    assert (channel.group_size, channel.symmetric) == (None, False)
    assert read(ct("pack-quantized", W4 | {"actorder": "group"})).act_order
    assert read(ct("int-quantized", W8, A8)).weights == INT8
    assert read(ct("float-quantized", F8, AF8)).weights == FP8
    # the format named by the group, as newer versions write it
    grouped = ct(None, W4)
    grouped["config_groups"]["group_0"]["format"] = "pack-quantized"
    assert read(grouped).layout == "pack-quantized"


def test_fp8():
    assert read({"quant_method": "fp8", "activation_scheme": "dynamic"}) == QuantizationScheme("fp8", FP8, "fp8")


@pytest.mark.parametrize("q, message", [
    ("awq", "quantization_config: must be an object"),
    ({"bits": 4}, "quantization_config.quant_method: None is not supported (awq, gptq, compressed-tensors, fp8)"),
    ({"quant_method": "bitsandbytes"}, "quantization_config.quant_method: 'bitsandbytes' is not supported"),
    (awq(bits=3), "quantization_config.bits: 3 is not supported (4)"),
    (awq(bits=True), "quantization_config.bits: True is not supported (4)"),
    (awq(group_size=256), "quantization_config.group_size: 256 is not supported (32 or 64 or 128)"),
    (awq(group_size=-1), "quantization_config.group_size: -1"),
    (awq(version="gemv"), "quantization_config.version: 'gemv' is not supported (gemm)"),
    (gptq(bits=8), "quantization_config.bits: 8 is not supported (4)"),
    (gptq(checkpoint_format="gptq_v2"), "quantization_config.checkpoint_format: 'gptq_v2' is not supported"),
    (gptq(is_marlin_format=True), "quantization_config.is_marlin_format: True"),
    (gptq(desc_act="yes"), "quantization_config.desc_act: 'yes' is not supported (true or false)"),
    ({"quant_method": "fp8", "activation_scheme": "static"}, "quantization_config.activation_scheme: 'static'"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "quantization_config.weight_block_size: [128, 128]"),
    (ct("naive-quantized", W8), "quantization_config.format: 'naive-quantized' is not supported"),
    (ct("pack-quantized", W4 | {"num_bits": 8}),
     "quantization_config.config_groups.group_0.weights.num_bits: 8 is not supported (4)"),
    (ct("pack-quantized", W4, A8), "quantization_config.config_groups.group_0.input_activations:"),
    (ct("pack-quantized", W4 | {"strategy": "tensor"}), "quantization_config.config_groups.group_0.weights.strategy"),
    (ct("int-quantized", W8, A8 | {"dynamic": False}),
     "quantization_config.config_groups.group_0.input_activations.dynamic: False"),
    (ct("int-quantized", W8 | {"symmetric": False}, A8),
     "quantization_config.config_groups.group_0.weights.symmetric: False"),
    (ct("float-quantized", F8 | {"strategy": "block"}, AF8),
     "quantization_config.config_groups.group_0.weights.strategy: 'block'"),
    (ct("pack-quantized", W4, quantization_status="frozen"), "quantization_config.quantization_status: 'frozen'"),
    (ct("pack-quantized", W4, sparsity_config={"format": "sparse-24-bitmask"}), "quantization_config.sparsity_config"),
    (ct("pack-quantized", W4) | {"config_groups": {"a": {"weights": W4}, "b": {"weights": W8}}},
     "quantization_config.config_groups: 2 is not supported (one group)"),
])
def test_anything_else_is_refused_naming_the_field(q, message):
    with pytest.raises(ValueError) as caught:
        read(q)
    assert str(caught.value).startswith(message)


def test_loaded_bytes_count_the_repacked_layout():
    s = read(gptq(desc_act=True, sym=False))
    n, k, groups = 64, 256, 2
    assert loaded_bytes(s, "m.q_proj.qweight", "I32", [k // 8, n]) == n * k // 2
    assert loaded_bytes(s, "m.q_proj.qzeros", "I32", [groups, n // 8]) == groups * n * 4
    assert loaded_bytes(s, "m.q_proj.scales", "F16", [groups, n]) == groups * n * 2
    assert loaded_bytes(s, "m.q_proj.g_idx", "I32", [k]) == k * 8
    assert loaded_bytes(s, "m.q_proj.bias", "F16", [n]) is None
    assert loaded_bytes(s, "model.embed_tokens.weight", "F16", [10, n]) is None
    w4 = read(ct("pack-quantized", W4))
    assert loaded_bytes(w4, "m.weight_scale", "BF16", [n, groups]) == n * groups * 4 * 2    # and the offsets
    assert loaded_bytes(w4, "m.weight_shape", "I64", [2]) == 0
    f8 = read({"quant_method": "fp8"})
    assert loaded_bytes(f8, "m.weight", "F8_E4M3", [n, k]) == n * k
    assert loaded_bytes(f8, "lm_head.weight", "BF16", [n, k]) is None
