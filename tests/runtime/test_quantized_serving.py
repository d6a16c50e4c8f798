"""A checkpoint kept quantized (GGUF Q4_K: 4-bit codes under two-level scales, the lm head
Q4_K too) through the engine's other features: paged KV with prefix caching, n-gram and
draft-model speculation, preemption; each must give the tokens plain greedy decoding gives."""
from __future__ import annotations

import pytest

from runtime import LLM, SamplingParams
from tests.runtime.test_speculative import NGRAM, _prompts

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
# K-quants quantize rows in blocks of 256: every matmul's input width is a multiple of it
SPEC = dict(arch="llama", hidden_size=256, intermediate_size=512, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def q4_k_folder(model_factory, tmp_path_factory):
    from runtime.gguf.importer import import_gguf
    from tests.support.gguf_files import write_model_gguf

    tmp = tmp_path_factory.mktemp("q4k")
    write_model_gguf(tmp / "m.gguf", model_factory(**SPEC), "Q4_K")
    return import_gguf(tmp / "m.gguf", tmp / "folder")


def _generate(model, prompts, **kwargs):
    llm = LLM(str(model), block_size=8, **{"kv_cache_tokens": 2048, **kwargs})
    return [o.token_ids for o in llm.generate(prompts, GREEDY)], llm.engine.stats()


@pytest.fixture(scope="module")
def baseline(q4_k_folder):
    from kernels.group_quant import GroupQuantized

    llm = LLM(str(q4_k_folder), block_size=8, kv_cache_tokens=2048, enable_prefix_caching=False)
    model = llm.engine.runner.model
    assert isinstance(model.layers[0].qkv, GroupQuantized) and isinstance(model.lm_head, GroupQuantized)
    return [o.token_ids for o in llm.generate(_prompts(0, 10), GREEDY)]


def test_prefix_cached_prompts_give_the_same_tokens(q4_k_folder, baseline):
    prompts = _prompts(0, 10)
    llm = LLM(str(q4_k_folder), block_size=8, kv_cache_tokens=2048)
    first = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    again = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    assert first == again == baseline
    assert llm.engine.stats().prefix_cache_hits > 0


def test_speculation_and_preemption_give_the_same_tokens(q4_k_folder, baseline):
    prompts = _prompts(0, 10)
    tokens, stats = _generate(q4_k_folder, prompts, speculative=NGRAM)
    assert tokens == baseline and stats.spec_proposed > 0
    draft = {"method": "draft", "model": str(q4_k_folder), "k": 3, "max_batch": 16}
    tokens, stats = _generate(q4_k_folder, prompts, speculative=draft, kv_cache_tokens=96,
                              max_num_seqs=4, max_num_batched_tokens=32)
    assert tokens == baseline
    assert stats.spec_accepted == stats.spec_proposed > 0 and stats.num_preemptions > 0


@pytest.mark.parametrize("options, field", [({"quantization": "int8"}, "quantization"),
                                            ({"batch_invariant": True}, "batch_invariant")])
def test_what_it_does_not_run_with_is_refused_naming_the_option(q4_k_folder, options, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        LLM(str(q4_k_folder), kv_cache_tokens=256, **options)
