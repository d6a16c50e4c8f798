"""quantization="int8": weight-only int8 linears, loaded from float safetensors."""
from __future__ import annotations

import random

import pytest
import torch

from runtime import LLM, SamplingParams
from runtime.engine.llm_engine import LLMEngine
from runtime.load.quantization import LINEAR_FIELDS, Int8Weight
from runtime.serve.server import parse_settings

GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
# linears dominate: 8 layers of 256 x (256 + 1024), one tied 512 x 256 embedding
WIDE = dict(arch="llama", hidden_size=256, intermediate_size=1024, num_hidden_layers=8,
            tie_word_embeddings=True)


def engine(path, quantization=None, dtype="float32") -> LLMEngine:
    return llm(path, quantization, dtype).engine


def llm(path, quantization=None, dtype="float32") -> LLM:
    return LLM(str(path), dtype=dtype, quantization=quantization, kv_cache_tokens=512, block_size=8)


def prompts(count: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 512) for _ in range(length)] for _ in range(count)]


@pytest.fixture(scope="module")
def llms(tiny_model):
    return llm(tiny_model), llm(tiny_model, "int8")


@pytest.fixture(scope="module")
def pair(llms):
    return llms[0].engine, llms[1].engine


def test_linears_are_int8_and_embeddings_norms_untouched(pair):
    full, int8 = pair
    for layer, ref in zip(int8.runner.model.layers, full.runner.model.layers):
        for name in LINEAR_FIELDS:
            w = getattr(layer, name)
            assert isinstance(w, Int8Weight) and w.qweight.dtype == torch.int8
            assert w.qweight.shape == getattr(ref, name).shape and w.scale.shape == w.qweight.shape[:1]
        assert torch.equal(layer.attn_norm, ref.attn_norm)
        assert torch.equal(layer.mlp_norm, ref.mlp_norm)
    qm, fm = int8.runner.model, full.runner.model
    assert torch.equal(qm.embed, fm.embed) and torch.equal(qm.norm, fm.norm)
    assert torch.equal(_dense(qm.lm_head), _dense(fm.lm_head))   # lm head kept in the engine dtype


def _dense(weight: torch.Tensor) -> torch.Tensor:
    """A float weight as loaded, also when the CPU kernels packed it for oneDNN."""
    return weight.to_dense() if weight.is_mkldnn else weight


def test_int8_logits_are_close_to_fp32_relative_to_their_scale(pair):
    full, int8 = pair
    for ids in prompts(3, 40):
        ref, got = full.runner.prompt_logits(ids), int8.runner.prompt_logits(ids)
        err = (got - ref).norm() / ref.norm()
        assert 0 < err < 0.05       # not identical (int8 really runs), yet within a few percent


def test_int8_greedy_tokens_mostly_agree_with_fp32(llms):
    batch = prompts(8, 12, seed=1)
    full, int8 = ([o.token_ids for o in m.generate(batch, GREEDY)] for m in llms)
    assert all(len(t) == GREEDY.max_tokens for t in int8)
    # tokens after the first disagreement follow another context, so count the common prefix
    agreed = sum(_common_prefix(a, b) for a, b in zip(full, int8))
    assert agreed >= 0.6 * len(batch) * GREEDY.max_tokens


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_int8_linear_bytes_are_one_per_weight_plus_an_fp32_scale_per_row(pair):
    full, int8 = pair
    layers = full.runner.model.layers
    rows = sum(getattr(layer, f).shape[0] for layer in layers for f in LINEAR_FIELDS)
    weights = sum(getattr(layer, f).numel() for layer in layers for f in LINEAR_FIELDS)
    assert full.weight_memory.linear_bytes == 4 * weights
    assert int8.weight_memory.linear_bytes == weights + 4 * rows
    embed_etc = full.weight_memory.total_bytes - full.weight_memory.linear_bytes
    assert int8.weight_memory.total_bytes == int8.weight_memory.linear_bytes + embed_etc
    assert int8.stats().weight_bytes == int8.weight_memory.total_bytes


@pytest.mark.parametrize("dtype, at_least", [("float32", 3.5), ("bfloat16", 1.9)])
def test_weight_bytes_shrink_linear_only_and_whole_model(model_factory, dtype, at_least):
    # The tiny model's 64-wide rows would make the fp32 scales 6% of int8 bytes and its
    # embedding half the model; this one has the proportions of a real checkpoint.
    path = model_factory(**WIDE)
    full, int8 = engine(path, dtype=dtype), engine(path, "int8", dtype=dtype)
    assert full.weight_memory.linear_bytes / int8.weight_memory.linear_bytes >= at_least
    assert full.weight_memory.linear_bytes / full.weight_memory.total_bytes > 0.95
    assert full.weight_memory.total_bytes / int8.weight_memory.total_bytes >= at_least


def test_int8_from_a_bf16_checkpoint_generates(model_factory):
    path = model_factory(arch="qwen2", dtype="bfloat16")     # tied embeddings and q/k/v bias
    (out,) = LLM(str(path), quantization="int8", kv_cache_tokens=256).generate([[5, 6, 7]], GREEDY)
    assert len(out.token_ids) == GREEDY.max_tokens


@pytest.mark.parametrize("value", ["int4", "fp8", "INT8", ""])
def test_unsupported_quantization_is_refused_by_field_name(tiny_model, value):
    with pytest.raises(ValueError, match="^quantization: "):
        LLM(str(tiny_model), quantization=value)


def test_server_flag_builds_an_int8_engine(tiny_model):
    settings = parse_settings(["--model", str(tiny_model), "--quantization", "int8",
                               "--kv-cache-tokens", "256"])
    eng = LLMEngine(settings.model, **settings.engine_kwargs)
    assert isinstance(eng.runner.model.layers[0].qkv, Int8Weight)
