"""spec/architectures.py: one list of what the runtime serves, each entry a model class,
the same list the control plane refuses others by, and every one with a tiny model here."""
from __future__ import annotations

import subprocess
import sys

import pytest

from spec.architectures import ARCHITECTURES, SUPPORTED_ARCHITECTURES, check_engine_options
from runtime.core.config import ModelConfig
from tests.runtime.conftest import ARCH_SPECS
from tests.support.model_factory import ARCHITECTURES as FACTORY_ARCHITECTURES


@pytest.mark.parametrize("architecture", SUPPORTED_ARCHITECTURES)
def test_each_names_a_model_class(architecture):
    from runtime.models import model_class
    from runtime.models.decoder import DecoderModel

    assert issubclass(model_class(architecture), DecoderModel)


def test_every_architecture_has_an_exactness_spec():
    covered = {FACTORY_ARCHITECTURES[spec["arch"]] for spec in ARCH_SPECS.values()}
    assert covered == set(SUPPORTED_ARCHITECTURES)


def test_the_control_plane_refuses_by_the_runtimes_list_without_torch():
    code = ("import sys, controlplane.deploy.deployment_spec as d, spec.architectures as r; "
            "print(d.SUPPORTED_ARCHITECTURES is r.SUPPORTED_ARCHITECTURES, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"]


def test_an_unknown_architecture_is_refused_by_name():
    with pytest.raises(ValueError, match="architecture: GPT2LMHeadModel is not supported"):
        ModelConfig.from_dict({"architectures": ["GPT2LMHeadModel"]})


def test_options_are_refused_per_architecture():
    check_engine_options("Gemma3ForCausalLM", 2, "int8")
    with pytest.raises(ValueError, match="tensor_parallel_size: Phi3ForCausalLM runs on one rank"):
        check_engine_options("Phi3ForCausalLM", 2, None)
    with pytest.raises(ValueError, match="quantization: int8 does not cover Qwen3MoeForCausalLM"):
        check_engine_options("Qwen3MoeForCausalLM", 1, "int8")
    assert not ARCHITECTURES["MixtralForCausalLM"].tensor_parallel


@pytest.mark.parametrize("architecture,gpus,engine,field", [
    ("Phi3ForCausalLM", 2, {}, "resources.gpu_count"),
    ("MixtralForCausalLM", 1, {"quantization": "int8"}, "engine.quantization"),
    ("Qwen3MoeForCausalLM", 2, {}, "resources.gpu_count"),
])
def test_the_deploy_refuses_what_the_architecture_cannot_run(architecture, gpus, engine, field):
    """At the control plane, with the field to fix, before any replica would start."""
    from controlplane.deploy.deployment_spec import Resources, check_model
    from controlplane.store.errors import InvalidField
    from pool.api import ModelInfo

    info = ModelInfo("s3://b/m/", architecture, 1, "float32", 1, ("model.safetensors",),
                     num_attention_heads=8, num_key_value_heads=4)
    with pytest.raises(InvalidField) as refused:
        check_model(info, Resources(gpu_count=gpus), engine=engine)
    assert refused.value.field == field and architecture in str(refused.value)
    check_model(info, Resources(gpu_count=1))                    # plain: served


@pytest.mark.parametrize("name,window", [("mistral_sliding", 16), ("phi3_sliding", 16), ("mistral", None),
                                         ("gemma2", None), ("gemma3", None)])
def test_blocks_are_freed_only_where_every_layer_slides(name, window, arch_model):
    assert ModelConfig.from_dir(arch_model(name)).kv_window == window


@pytest.mark.parametrize("arch,fields,windows", [
    ("MistralForCausalLM", dict(sliding_window=16), (16, 16, 16)),
    ("MistralForCausalLM", dict(sliding_window=None), ()),
    ("Qwen2ForCausalLM", dict(sliding_window=32768), ()),            # without use_sliding_window: off
    ("Qwen2ForCausalLM", dict(sliding_window=16, use_sliding_window=True, max_window_layers=1), (None, 16, 16)),
    ("Qwen3ForCausalLM", dict(sliding_window=16, layer_types=["full_attention", "sliding_attention",
                                                              "full_attention"]), ()),
    ("Gemma2ForCausalLM", dict(sliding_window=16), (16, None, 16)),
    ("Phi3ForCausalLM", dict(sliding_window=2047), (2047, 2047, 2047)),
])
def test_which_layers_slide_follows_transformers(arch, fields, windows):
    base = dict(architectures=[arch], hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, vocab_size=10)
    assert ModelConfig.from_dict({**base, **fields}).layer_windows == windows


def test_adapters_are_refused_where_they_cannot_run():
    from spec.architectures import engine_option_refusal
    assert engine_option_refusal("LlamaForCausalLM", 1, None, max_loras=4) is None
    for arch in ("MixtralForCausalLM", "Phi3ForCausalLM"):
        option, why = engine_option_refusal(arch, 1, None, max_loras=4)
        assert option == "max_loras" and arch in why
    assert engine_option_refusal("LlamaForCausalLM", 2, None, max_loras=4)[0] == "max_loras"
    assert engine_option_refusal("MixtralForCausalLM", 1, None) is None, "no adapters asked"
