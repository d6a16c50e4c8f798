"""spec/engine_options.py: one object of the engine's options, one validation naming the
option, the tenant's subset, and one spelling as the server's flags."""
from __future__ import annotations

import argparse
import dataclasses

import pytest

from spec import engine_options
from spec.engine_options import ChosenOptions, EngineOptions, InvalidOption, parse


@pytest.mark.parametrize("values, option", [
    ({"dtype": "auto"}, "dtype"),
    ({"quantization": "int4"}, "quantization"),
    ({"task": "classify"}, "task"),
    ({"pooling": "max"}, "pooling"),
    ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype"),
    ({"batch_invariant": "yes"}, "batch_invariant"),
    ({"seed": True}, "seed"),
    ({"seed": "7"}, "seed"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"max_model_len": -1}, "max_model_len"),
    ({"speculative": "ngram"}, "speculative"),
    ({"kv_cache_tokens": 8}, "kv_cache_tokens"),                 # under one block
    ({"task": "embed", "speculative": {"method": "ngram"}}, "speculative"),
    ({"cuda_graphs": True}, "cuda_graphs"),                      # on the CPU
    ({"batch_invariant": True, "device": "cuda:0"}, "batch_invariant"),
    ({"max_loras": -1}, "max_loras"),
    ({"max_loras": 2, "tensor_parallel_size": 2}, "max_loras"),  # adapters run on one rank
    ({"max_loras": 2, "speculative": {"method": "ngram", "k": 2}}, "max_loras"),
    ({"max_lora_rank": 0}, "max_lora_rank"),
    ({"turbo": True}, "turbo"),
])
def test_each_refusal_names_its_option(values, option):
    with pytest.raises(InvalidOption) as refused:
        parse(values)
    assert refused.value.option == option and str(refused.value).startswith(f"{option}: ")
    assert isinstance(refused.value, ValueError), "the runtime's callers catch ValueError"


def test_unset_and_null_options_keep_the_defaults():
    assert parse({}) == EngineOptions()
    assert parse({"max_model_len": None, "packed_cache_gb": 2}) == EngineOptions(packed_cache_gb=2)


def test_a_tenant_sets_only_its_subset():
    assert engine_options.TENANT_OPTIONS < engine_options.OPTIONS
    parse({"dtype": "bfloat16", "seed": 3}, engine_options.TENANT_OPTIONS)
    for name, value in {"device": "cuda", "packed_cache_dir": "/p", "cache_salt": "s", "cuda_graphs": True}.items():
        with pytest.raises(InvalidOption, match=f"^{name}: unknown engine option"):
            parse({name: value}, engine_options.TENANT_OPTIONS)


def test_every_option_has_a_flag_that_reads_back():
    parser = argparse.ArgumentParser()
    engine_options.add_flags(parser)
    changed = {"device": "cuda", "kv_cache_tokens": 64, "enable_prefix_caching": False,
               "speculative": {"method": "ngram", "k": 2}, "packed_cache_gb": 1.5, "batch_invariant": True}
    assert engine_options.from_flags(parser.parse_args(engine_options.to_flags(changed))) == changed
    assert engine_options.from_flags(parser.parse_args([])) == {}
    flags = {a.dest for a in parser._actions}
    assert engine_options.OPTIONS <= flags


def test_the_runtimes_config_is_the_options_and_the_model():
    from runtime.core.config import EngineConfig

    options = parse({"dtype": "bfloat16", "block_size": 32})
    config = EngineConfig.of("/m", options)
    assert config.model == "/m" and config.block_size == 32 and config.dtype == "bfloat16"
    assert {f.name for f in dataclasses.fields(config)} == engine_options.OPTIONS | {"model"}
    with pytest.raises(ValueError, match="^block_size: must be a positive integer"):
        dataclasses.replace(config, block_size=0).validate()


def test_chosen_options_keep_what_was_set_apart_from_the_defaults():
    chosen = ChosenOptions({"dtype": "bfloat16", "seed": None})
    assert dict(chosen) == {"dtype": "bfloat16"} and "seed" not in chosen      # null: not chosen
    assert chosen == {"dtype": "bfloat16"} and chosen == ChosenOptions({"dtype": "bfloat16"})
    pool_side = chosen.with_defaults(dtype="float32", kv_cache_tokens=64).with_(device="cuda:1")
    assert pool_side == {"dtype": "bfloat16", "kv_cache_tokens": 64, "device": "cuda:1"}
    assert chosen == {"dtype": "bfloat16"}                                      # a copy, never changed
    assert pool_side.with_(device=None) == {"dtype": "bfloat16", "kv_cache_tokens": 64}
    assert pool_side.options().device == "cuda:1" and ChosenOptions().options() == EngineOptions()
    assert pool_side.to_json() == dict(pool_side)


def test_chosen_options_refuse_an_unknown_name_at_once_and_a_bad_value_when_built():
    with pytest.raises(InvalidOption, match="^temperature: unknown engine option"):
        ChosenOptions({"temperature": 0.5})
    chosen = ChosenOptions({"block_size": 0})       # a row the deploy of an older version kept
    with pytest.raises(InvalidOption, match="^block_size: must be a positive integer"):
        chosen.options()
