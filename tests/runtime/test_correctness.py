"""Greedy tokens equal transformers token for token (fp32); top-5 logprobs within 1e-3."""
from __future__ import annotations

import random

import pytest

from runtime import LLM, SamplingParams
from tests.runtime.conftest import ARCH_SPECS, hf_greedy

NEW_TOKENS = 36


def _prompts(seed: int, lengths: list[int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 512) for _ in range(n)] for n in lengths]


@pytest.mark.parametrize("name", list(ARCH_SPECS))
def test_single_prompt_matches_transformers(name, arch_model, hf_oracle):
    path = arch_model(name)
    prompt = _prompts(1, [23])[0]
    expected, hf_logprobs = hf_greedy(hf_oracle(path), prompt, NEW_TOKENS)
    llm = LLM(str(path), kv_cache_tokens=512)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, logprobs=5)
    (out,) = llm.generate([prompt], params)
    assert out.token_ids == expected
    assert out.finish_reason == "length"
    for step, (chosen, top), ref in zip(range(NEW_TOKENS), out.logprobs, hf_logprobs):
        assert abs(chosen - ref[expected[step]].item()) < 1e-3
        assert [t for t, _ in top] == ref.topk(5).indices.tolist()
        for token, value in top:
            assert abs(value - ref[token].item()) < 1e-3, (step, token)


@pytest.mark.parametrize("name", list(ARCH_SPECS))
def test_batch_with_chunking_and_preemption_matches_transformers(name, arch_model, hf_oracle):
    """Different lengths served together; a small cache and budget force chunks and preemption."""
    path = arch_model(name)
    prompts = _prompts(2, [5, 41, 17, 64, 9, 30])
    hf = hf_oracle(path)
    expected = [hf_greedy(hf, p, NEW_TOKENS)[0] for p in prompts]
    llm = LLM(str(path), kv_cache_tokens=208, block_size=8, max_num_batched_tokens=24,
              max_num_seqs=4)
    outs = llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0,
                                                ignore_eos=True))
    assert [o.token_ids for o in outs] == expected
    assert llm.engine.stats().num_preemptions > 0
    assert llm.engine.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("name", ["llama_gqa", "llama3_rope"])
def test_rope_frequencies_equal_transformers(name, arch_model, hf_oracle):
    import torch

    from runtime.config import ModelConfig
    from runtime.models.llama import rope_inv_freq

    path = arch_model(name)
    hf_rotary = hf_oracle(path).model.rotary_emb
    ours = rope_inv_freq(ModelConfig.from_dir(path))
    assert torch.equal(ours, hf_rotary.inv_freq.float())
    assert hf_rotary.attention_scaling == 1.0
