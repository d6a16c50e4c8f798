"""Batch-invariant mode: a request's tokens and logprobs are the same bits alone and in any
batch (runtime/core/config.py `batch_invariant`).

Each request is first run alone; then all of them again, in random compositions: random
arrival steps (a request joins others mid-decode), a small token budget (prompts are
chunked wherever the budget runs out, down to one-token chunks), random max_num_seqs,
with prefix caching on and shared prompt prefixes (some prompts start from cached blocks).
Every logprob must equal its solo value exactly, not approximately.

The negative control runs the same check with the default engine (batch_invariant off):
it must see a difference, or the check above could pass without testing anything.
"""
from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from runtime.engine.llm_engine import LLMEngine
from wire.sampling import SamplingParams

NUM_REQUESTS = 8
COMPOSITIONS = 3
PARAMS = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=3)


@pytest.fixture(scope="module")
def model(model_factory):
    # tied: the lm head is the embedding, a weight that is not prepacked for oneDNN, whose
    # row-invariance on the AVX2 machines here would otherwise hide a plain GEMM's variance
    return model_factory(arch="llama", hidden_size=256, intermediate_size=704, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True, seed=3)


@pytest.fixture(scope="module")
def window_model(model_factory):
    return model_factory(arch="mistral", hidden_size=128, intermediate_size=256, num_attention_heads=4,
                         num_key_value_heads=2, seed=4, config={"sliding_window": 40})


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, 500) for _ in range(40)]     # 2.5 blocks of 16: a cacheable prefix
    prompts = []
    for i in range(NUM_REQUESTS):
        own = [rng.randrange(3, 500) for _ in range(rng.randrange(1, 90))]
        prompts.append(shared[:rng.randrange(17, 41)] + own if i % 3 == 0 else own)
    return prompts


def _engine(model, invariant: bool = True, **options) -> LLMEngine:
    return LLMEngine(str(model), batch_invariant=invariant, kv_cache_tokens=4096, seed=0, **options)


def _run(engine: LLMEngine, prompts: list[list[int]], arrivals: list[int]) -> dict[str, tuple]:
    """Adds prompt i at step arrivals[i]; returns each request's (tokens, logprobs)."""
    tokens: dict[str, list] = {str(i): [] for i in range(len(prompts))}
    logprobs: dict[str, list] = {str(i): [] for i in range(len(prompts))}
    pending = sorted(range(len(prompts)), key=arrivals.__getitem__)
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and arrivals[pending[0]] <= step:
            i = pending.pop(0)
            engine.add_request(str(i), prompts[i], PARAMS)
        for delta in engine.step():
            tokens[delta.request_id].extend(delta.new_token_ids)
            logprobs[delta.request_id].extend(delta.new_logprobs or [])
        step += 1
    return {i: (tokens[i], logprobs[i]) for i in tokens}


def _solo(model, prompts: list[list[int]], invariant: bool = True) -> dict[str, tuple]:
    out = {}
    for i, prompt in enumerate(prompts):
        engine = _engine(model, invariant, enable_prefix_caching=False)   # truly alone: nothing cached
        out[str(i)] = _run(engine, [prompt], [0])["0"]
        engine.close()
    return out


def _assert_same(solo: dict[str, tuple], batched: dict[str, tuple], what: str) -> None:
    for rid, (tokens, logprobs) in solo.items():
        assert len(tokens) == PARAMS.max_tokens
        assert batched[rid][0] == tokens, f"{what}: request {rid}'s tokens"
        # exact: the floats themselves, chosen token's and the top-3 alike
        assert batched[rid][1] == logprobs, f"{what}: request {rid}'s logprobs"


def _compositions(model, prompts: list[list[int]], invariant: bool) -> Iterator[tuple[str, dict[str, tuple]]]:
    """Each random composition's description and results: the same compositions for
    either mode (a fixed seed, arrivals counted in engine steps, never in time)."""
    rng = random.Random(5)
    for n in range(COMPOSITIONS):
        engine = _engine(model, invariant, max_num_batched_tokens=rng.choice([7, 16, 33, 64]),
                         max_num_seqs=rng.choice([2, 3, 5, NUM_REQUESTS]))
        arrivals = [rng.randrange(0, 12) for _ in prompts]
        batched = _run(engine, prompts, arrivals)
        engine.close()
        yield f"composition {n} (arrivals {arrivals})", batched


@pytest.mark.parametrize("which", ["llama", "sliding_window"])
def test_logprobs_are_the_same_bits_in_any_batch(which, model, window_model):
    chosen = model if which == "llama" else window_model
    prompts = _prompts(seed=11)
    solo = _solo(chosen, prompts)
    for what, batched in _compositions(chosen, prompts, invariant=True):
        _assert_same(solo, batched, what)


def test_the_default_engine_fails_the_same_check(model):
    """The negative control: batch_invariant off, the same prompts and compositions,
    some logprob differs from its solo value."""
    prompts = _prompts(seed=11)
    solo = _solo(model, prompts, invariant=False)
    differ = [what for what, batched in _compositions(model, prompts, invariant=False)
              if any(batched[rid][1] != logprobs for rid, (_, logprobs) in solo.items())]
    assert differ, "the default engine gave the same bits in every batch: the check tests nothing"


def test_batch_invariant_refuses_what_it_cannot_keep(model):
    with pytest.raises(ValueError, match="batch_invariant"):
        LLMEngine(str(model), batch_invariant=True, quantization="int8", kv_cache_tokens=256)
    with pytest.raises(ValueError, match="batch_invariant"):
        LLMEngine(str(model), batch_invariant=True, device="cuda", kv_cache_tokens=256)
