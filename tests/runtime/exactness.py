"""The engine against transformers on the same folder, as every architecture is tested:
greedy tokens equal token for token (fp32), top-5 logprobs within 1e-3, for one prompt
alone and for prompts of different lengths batched continuously, with chunked prefill,
prefix caching and preemption forced by a small cache and token budget."""
from __future__ import annotations

import random

from runtime import LLM, SamplingParams
from tests.runtime.conftest import hf_greedy

NEW_TOKENS = 36
BATCH_LENGTHS = [5, 41, 17, 64, 9, 30]


def prompts(seed: int, lengths: list[int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 512) for _ in range(n)] for n in lengths]


def check_single_prompt(path, hf, length: int = 23, **engine) -> None:
    prompt = prompts(1, [length])[0]
    expected, hf_logprobs = hf_greedy(hf, prompt, NEW_TOKENS)
    llm = LLM(str(path), **{"kv_cache_tokens": 512, **engine})
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, logprobs=5)
    (out,) = llm.generate([prompt], params)
    assert out.token_ids == expected
    assert out.finish_reason == "length"
    for step, (chosen, top), ref in zip(range(NEW_TOKENS), out.logprobs, hf_logprobs):
        assert abs(chosen - ref[expected[step]].item()) < 1e-3
        assert [t for t, _ in top] == ref.topk(5).indices.tolist()
        for token, value in top:
            assert abs(value - ref[token].item()) < 1e-3, (step, token)


def check_batch(path, hf, lengths: list[int] = BATCH_LENGTHS, **engine) -> LLM:
    """Returns the engine, for more checks on what it did."""
    batch = prompts(2, lengths)
    batch[3][:24] = batch[1][:24]            # a shared prefix, for the prefix cache to find
    expected = [hf_greedy(hf, p, NEW_TOKENS)[0] for p in batch]
    llm = LLM(str(path), **{"kv_cache_tokens": 208, "block_size": 8, "max_num_batched_tokens": 24,
                            "max_num_seqs": 4, **engine})
    outs = llm.generate(batch, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True))
    assert [o.token_ids for o in outs] == expected
    stats = llm.engine.stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert llm.engine.block_manager.num_used_blocks == 0
    return llm
