"""spec/lora_adapter.py: the rules an adapter is checked by at attach time and again in the
replica. Each refusal names its field; a good config and header pass and say what the
adapter changes; tensors of another base, a header cut off and non-float tensors are
refused. Headers are built here byte by byte, as safetensors lays them out."""
from __future__ import annotations

import json
import math
import struct

import pytest

from spec.lora_adapter import (MAX_CONFIG_BYTES, MODULES, BaseDims, check_header, check_tensors,
                               header_length, parse_settings, tensor_shapes)

DIMS = BaseDims(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16)
GOOD = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["v_proj", "q_proj", "down_proj"],
        "bias": "none", "use_dora": False, "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {}}


def key(layer: int, module: str, half: str) -> str:
    group = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
    return f"base_model.model.model.layers.{layer}.{group}.{module}.lora_{half}.weight"


def shapes_of(rank: int, modules: list[str], dims: BaseDims = DIMS) -> dict[str, list[int]]:
    """Every layer's A and B of `modules` at `rank`, shaped for `dims`."""
    out = {}
    for layer in range(dims.num_hidden_layers):
        for module in modules:
            out_features, in_features = dims.module_shapes()[module]
            out[key(layer, module, "A")] = [rank, in_features]
            out[key(layer, module, "B")] = [out_features, rank]
    return out


def safetensors_head(shapes: dict[str, list[int]], dtype: str = "F32") -> bytes:
    """A safetensors file's length and header (the data after it does not matter here)."""
    entries: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        size = 4 * math.prod(shape)
        entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header = json.dumps(entries).encode()
    return struct.pack("<Q", len(header)) + header


# ---------------------------------------------------------------- adapter_config.json

@pytest.mark.parametrize("changes, field", [
    ({"peft_type": "IA3"}, "peft_type"),
    ({"r": 0}, "r"), ({"r": True}, "r"), ({"r": "8"}, "r"), ({"r": 2.0}, "r"),
    ({"r": 32}, "r"),                                                   # above max_rank
    ({"use_dora": True}, "use_dora"), ({"fan_in_fan_out": True}, "fan_in_fan_out"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"rank_pattern": {"q_proj": 4}}, "rank_pattern"), ({"alpha_pattern": {"q_proj": 4}}, "alpha_pattern"),
    ({"layers_to_transform": [0]}, "layers_to_transform"),
    ({"bias": "lora_only"}, "bias"),
    ({"lora_alpha": "16"}, "lora_alpha"), ({"lora_alpha": True}, "lora_alpha"),
    ({"lora_alpha": float("inf")}, "lora_alpha"),
    ({"target_modules": []}, "target_modules"), ({"target_modules": "q_proj"}, "target_modules"),
    ({"target_modules": ["q_proj", 3]}, "target_modules"),
    ({"target_modules": ["q_proj", "lm_head"]}, "target_modules"),
    ({"target_modules": ["embed_tokens"]}, "target_modules"),
])
def test_each_refused_setting_is_named(changes, field):
    with pytest.raises(ValueError) as refused:
        parse_settings({**GOOD, **changes}, max_rank=16)
    assert str(refused.value).startswith(f"{field}: "), refused.value


def test_a_missing_rank_or_target_list_is_named():
    for field in ("r", "target_modules"):
        settings = {k: v for k, v in GOOD.items() if k != field}
        with pytest.raises(ValueError, match=f"^{field}: "):
            parse_settings(settings, max_rank=16)


@pytest.mark.parametrize("raw", [b"{not json", "[1, 2]", b"null", 7, b" " * (MAX_CONFIG_BYTES + 1)])
def test_a_config_that_is_not_a_json_object_is_refused_as_the_file(raw):
    with pytest.raises(ValueError, match="^adapter_config.json: "):
        parse_settings(raw, max_rank=16)


def test_a_good_config_reads_the_same_as_bytes_text_or_object():
    read = [parse_settings(form, max_rank=8) for form in (json.dumps(GOOD).encode(), json.dumps(GOOD), GOOD)]
    assert read[0] == read[1] == read[2]
    settings = read[0]
    assert settings.rank == 8 and settings.alpha == 16.0 and settings.scaling == 2.0
    assert settings.target_modules == ("q_proj", "v_proj", "down_proj")   # the engine's order
    rslora = parse_settings({**GOOD, "use_rslora": True}, max_rank=8)
    assert rslora.scaling == pytest.approx(16 / math.sqrt(8))
    assert parse_settings({"r": 4, "target_modules": ["o_proj"]}, max_rank=8).alpha == 4.0   # alpha: r


# ---------------------------------------------------------------- the safetensors header

def test_a_good_header_passes_and_names_what_it_changes():
    settings = parse_settings(GOOD, max_rank=16)
    pairs = check_header(safetensors_head(shapes_of(8, ["q_proj", "v_proj", "down_proj"])), settings, DIMS)
    assert pairs == [(0, "down_proj"), (0, "q_proj"), (0, "v_proj"),
                     (1, "down_proj"), (1, "q_proj"), (1, "v_proj")]


def test_every_module_passes_in_bf16_with_data_after_the_header():
    settings = parse_settings({**GOOD, "target_modules": list(MODULES)}, max_rank=16)
    data = safetensors_head(shapes_of(8, list(MODULES)), dtype="BF16") + b"\0" * 4096
    assert len(check_header(data, settings, DIMS)) == 2 * len(MODULES)


def test_tensors_shaped_for_another_base_are_refused():
    settings = parse_settings(GOOD, max_rank=16)
    wider = BaseDims(2, 96, 192, 4, 2, 24)
    with pytest.raises(ValueError, match="another base model"):
        check_header(safetensors_head(shapes_of(8, ["q_proj", "v_proj", "down_proj"], wider)), settings, DIMS)


def test_tensors_of_another_rank_than_the_config_are_refused():
    settings = parse_settings(GOOD, max_rank=16)
    with pytest.raises(ValueError, match=r"lora_A is \(4, 64\), where this base needs \(8, 64\)"):
        check_tensors(shapes_of(4, ["q_proj"]), settings, DIMS)


@pytest.mark.parametrize("shapes, why", [
    ({key(0, "q_proj", "A"): [8, 64]}, "lacks its A or B"),
    ({key(2, "q_proj", "A"): [8, 64], key(2, "q_proj", "B"): [64, 8]}, "names layer 2; the base has 2"),
    ({"base_model.model.lm_head.lora_A.weight": [8, 64]}, "lm_head and embedding deltas"),
    ({key(0, "gate_up_proj", "A"): [8, 64]}, "is not a LoRA A or B"),
    ({}, "holds no LoRA weights"),
])
def test_what_is_not_a_full_pair_of_a_targeted_projection_is_refused(shapes, why):
    settings = parse_settings(GOOD, max_rank=16)
    with pytest.raises(ValueError, match=f"^adapter_model.safetensors: .*{why}"):
        check_tensors(shapes, settings, DIMS)


def test_a_truncated_header_is_refused():
    settings = parse_settings(GOOD, max_rank=16)
    whole = safetensors_head(shapes_of(8, ["q_proj", "v_proj", "down_proj"]))
    check_header(whole, settings, DIMS)      # the control: whole, it passes
    with pytest.raises(ValueError, match="cut off inside its header"):
        check_header(whole[:-1], settings, DIMS)
    with pytest.raises(ValueError, match="too short to be safetensors"):
        check_header(whole[:7], settings, DIMS)


@pytest.mark.parametrize("length", [0, 1, 16 * 1024 * 1024 + 1, 2 ** 63])
def test_a_header_length_no_safetensors_file_has_is_refused(length):
    with pytest.raises(ValueError, match="is not safetensors"):
        header_length(struct.pack("<Q", length))


@pytest.mark.parametrize("dtype", ["I8", "I32", "U8", "BOOL", "F8_E4M3", "F64"])
def test_tensors_that_are_not_half_or_single_floats_are_refused(dtype):
    settings = parse_settings(GOOD, max_rank=16)
    head = safetensors_head(shapes_of(8, ["q_proj", "v_proj", "down_proj"]), dtype=dtype)
    with pytest.raises(ValueError, match="is not a float tensor"):
        check_header(head, settings, DIMS)


@pytest.mark.parametrize("header, why", [
    (b"{not json", "its header is not JSON"), (b"\xff\xfe", "its header is not JSON"),
    (b"[1, 2]", "its header is not a JSON object"),
    (json.dumps({key(0, "q_proj", "A"): {"dtype": "F32", "shape": [8, "64"]}}).encode(), "not a float tensor"),
    (json.dumps({key(0, "q_proj", "A"): [8, 64]}).encode(), "not a float tensor"),
])
def test_a_header_that_is_not_a_table_of_float_tensors_is_refused(header, why):
    with pytest.raises(ValueError, match=why):
        tensor_shapes(header)
