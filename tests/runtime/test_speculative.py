"""Speculative decoding: n-gram lookup, backoff policy, rejection sampling, engine exactness."""
from __future__ import annotations

import random

import pytest
import torch

from runtime import LLM, SamplingParams
from runtime.engine.block_manager import block_hashes
from runtime.engine.llm_engine import LLMEngine
from runtime.spec_decode.proposers import NgramProposer, ProposalRequest, ngram_lookup
from runtime.spec_decode.rejection_sampler import greedy_verify, rejection_sample
from runtime.engine.request import RequestStatus
from runtime.spec_decode.speculator import BackoffPolicy, SpeculativeConfig, speculation_k, updated_acceptance

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
NGRAM = {"method": "ngram", "k": 4, "n": 3, "max_batch": 16}   # no backoff for 10 prompts


# ---- n-gram lookup (pure)
def test_ngram_copies_what_followed_the_latest_match():
    tokens = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert ngram_lookup(tokens, k=2, n=3) == [7, 8]          # the latest earlier "1 2 3"
    assert ngram_lookup(tokens, k=9, n=3) == [7, 8, 5, 1, 2, 3]  # stops at the end


def test_ngram_falls_back_to_shorter_ngrams_and_gives_up():
    assert ngram_lookup([4, 5, 6, 1, 6], k=2, n=3) == [1, 6]   # only the 1-gram "6" recurs
    assert ngram_lookup([1, 2, 3, 4], k=3, n=3) == []
    assert ngram_lookup([7], k=3, n=3) == []


def test_ngram_proposer_skips_requests_without_a_match():
    asks = [ProposalRequest("a", [1, 2, 1], 2, GREEDY), ProposalRequest("b", [1, 2, 3], 2, GREEDY)]
    proposals = NgramProposer(n=2).propose(asks)
    assert list(proposals) == ["a"] and proposals["a"].token_ids == [2, 1]
    assert proposals["a"].probs is None


# ---- backoff (pure)
def test_backoff_turns_off_for_a_large_batch_and_shrinks_on_low_acceptance():
    policy = BackoffPolicy(max_batch=8, min_acceptance=0.3)
    assert speculation_k(policy, 4, num_decoding=1, acceptance=0.9) == 4
    assert speculation_k(policy, 4, num_decoding=8, acceptance=0.9) == 4
    assert speculation_k(policy, 4, num_decoding=9, acceptance=0.9) == 0
    assert speculation_k(policy, 4, num_decoding=2, acceptance=0.29) == 1
    assert speculation_k(policy, 4, num_decoding=9, acceptance=0.1) == 0


def test_acceptance_ewma_falls_with_rejections_and_recovers():
    policy = BackoffPolicy(alpha=0.5)
    a = 1.0
    for _ in range(3):
        a = updated_acceptance(policy, a, proposed=4, accepted=0)
    assert a == pytest.approx(0.125)
    assert speculation_k(policy, 4, 1, a) == 1
    assert updated_acceptance(policy, a, proposed=0, accepted=0) == a     # nothing proposed
    for _ in range(3):
        a = updated_acceptance(policy, a, proposed=1, accepted=1)
    assert speculation_k(policy, 4, 1, a) == 4


def test_speculative_config_names_what_is_wrong():
    assert SpeculativeConfig.parse({"method": "ngram"}).k == 4
    for bad in ({"method": "magic"}, {"method": "ngram", "k": 0}, {"method": "draft"},
                {"method": "ngram", "bogus": 1}, "ngram"):
        with pytest.raises(ValueError, match="speculative"):
            SpeculativeConfig.parse(bad)


def test_the_engine_refuses_a_bad_speculative_config_before_loading(tiny_model):
    with pytest.raises(ValueError, match="^speculative: method"):
        LLMEngine(str(tiny_model), speculative={"method": "magic", "k": 4})


# ---- verification (tensors)
def test_greedy_verify_keeps_the_matching_prefix_then_the_target_token():
    logits = torch.full((4, 6), -1.0)
    for row, best in enumerate([2, 3, 5, 1]):
        logits[row, best] = 1.0
    assert greedy_verify(logits, [2, 3, 5]) == [2, 3, 5, 1]    # all accepted + bonus
    assert greedy_verify(logits, [2, 4, 5]) == [2, 3]          # correction at the mismatch
    assert greedy_verify(logits, [0, 3, 5]) == [2]


P = torch.tensor([[0.5, 0.2, 0.2, 0.1], [0.1, 0.1, 0.1, 0.7]])
Q = torch.tensor([[0.1, 0.6, 0.2, 0.1]])
DRAWS = 6000
CHI2_BOUND = 25.0      # 3 degrees of freedom: P(chi2 > 25) < 2e-5


def _chi2(counts: list[int], probs: torch.Tensor) -> float:
    n = sum(counts)
    return sum((c - n * float(p)) ** 2 / (n * float(p)) for c, p in zip(counts, probs))


def _first_tokens(verify, q) -> tuple[list[int], list[int]]:
    """Draw proposals from q (or a fixed one-hot guess) and verify; tally emitted tokens."""
    gen = torch.Generator().manual_seed(7)
    first, bonus = [0] * 4, [0] * 4
    for _ in range(DRAWS):
        draft = int(torch.multinomial(q[0], 1, generator=gen)) if q is not None else 1
        out = verify(P, [draft], q, gen)
        first[out[0]] += 1
        if len(out) == 2:
            bonus[out[1]] += 1
    return first, bonus


@pytest.mark.parametrize("q", [Q, None], ids=["draft_model", "ngram_one_hot"])
def test_rejection_sampling_emits_the_target_distribution(q):
    first, bonus = _first_tokens(rejection_sample, q)
    assert _chi2(first, P[0]) < CHI2_BOUND
    assert sum(bonus) > 500 and _chi2(bonus, P[1]) < CHI2_BOUND


def test_the_chi2_bound_rejects_a_wrong_rule():
    """Resampling from p itself (not from max(0, p - q)) after a rejection is biased
    toward the proposal; the same test must catch it."""
    def wrong(p, draft_ids, q, gen):
        x = draft_ids[0]
        if float(torch.rand(1, generator=gen)) * float(q[0, x]) < float(p[0, x]):
            return [x]
        return [int(torch.multinomial(p[0], 1, generator=gen))]

    first, _ = _first_tokens(wrong, Q)
    assert _chi2(first, P[0]) > CHI2_BOUND


# ---- the engine: exact under greedy
def _prompts(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        span = [rng.randrange(5, 512) for _ in range(rng.randrange(3, 9))]
        tail = [rng.randrange(5, 512) for _ in range(rng.randrange(0, 5))]
        prompts.append(span * rng.randrange(2, 5) + tail if i % 3 else tail + span)
    return prompts


def _generate(model, prompts, params=GREEDY, **kwargs):
    llm = LLM(str(model), block_size=8, **{"kv_cache_tokens": 2048, **kwargs})
    return [o.token_ids for o in llm.generate(prompts, params)], llm.engine.stats()


@pytest.fixture(scope="module")
def prompts():
    return _prompts(0, 10)


@pytest.fixture(scope="module")
def baseline(tiny_model, prompts):
    tokens, _ = _generate(tiny_model, prompts)
    return tokens


def test_ngram_greedy_equals_no_speculation(tiny_model, prompts, baseline):
    tokens, stats = _generate(tiny_model, prompts, speculative=NGRAM)
    assert tokens == baseline
    assert all(len(t) == GREEDY.max_tokens for t in tokens)
    assert stats.spec_proposed > 0 and 0 < stats.spec_accepted <= stats.spec_proposed


def test_ngram_exact_with_continuous_batching_and_preemption(tiny_model, prompts, baseline):
    tokens, stats = _generate(tiny_model, prompts, speculative=NGRAM, kv_cache_tokens=96,
                              max_num_seqs=4, max_num_batched_tokens=32)
    assert stats.num_preemptions > 0
    assert tokens == baseline


def test_draft_equal_to_the_target_accepts_everything(tiny_model, prompts, baseline):
    spec = {"method": "draft", "model": str(tiny_model), "k": 3, "max_batch": 16}
    tokens, stats = _generate(tiny_model, prompts, speculative=spec)
    assert tokens == baseline
    assert stats.spec_proposed > 0 and stats.spec_accepted == stats.spec_proposed


def test_a_different_random_draft_still_gives_identical_output(tiny_model, model_factory, prompts,
                                                               baseline):
    draft = model_factory(arch="llama", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=1, seed=1)
    spec = {"method": "draft", "model": str(draft), "k": 4, "max_batch": 16}
    tokens, stats = _generate(tiny_model, prompts, speculative=spec)
    assert tokens == baseline
    assert stats.spec_accepted < stats.spec_proposed
    tokens, stats = _generate(tiny_model, prompts, speculative=spec, kv_cache_tokens=96,
                              max_num_seqs=4, max_num_batched_tokens=32)
    assert stats.num_preemptions > 0 and tokens == baseline


def test_stop_tokens_and_max_tokens_cut_inside_an_accepted_run(tiny_model, prompts, baseline):
    stop = baseline[1][len(baseline[1]) // 2]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, stop_token_ids=[stop])
              for n in (3, 24, 7, 24, 1, 24, 24, 5, 24, 24)]
    want, _ = _generate(tiny_model, prompts, params)
    got, _ = _generate(tiny_model, prompts, params, speculative=NGRAM)
    assert got == want
    # each ends at its max_tokens or right at the stop token, whichever came first
    for tokens, p in zip(got, params):
        assert stop not in tokens[:-1]
        assert len(tokens) == p.max_tokens or (tokens[-1] == stop and len(tokens) < p.max_tokens)
    assert sum(t[-1] == stop and len(t) < p.max_tokens for t, p in zip(got, params)) >= 1, \
        "the stop token cut at least one run"


def test_only_committed_tokens_are_hashed_into_the_prefix_cache(tiny_model, prompts):
    engine = LLMEngine(str(tiny_model), kv_cache_tokens=2048, block_size=8, speculative=NGRAM)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, GREEDY)
    bm = engine.block_manager
    while engine.has_unfinished_requests():
        engine.step()
        bm.check_invariants()
        for rid, request in engine.scheduler.requests.items():
            if request.status is RequestStatus.RUNNING:
                hashes = bm._hashes[rid]
                assert len(hashes) * 8 <= request.num_computed_tokens < request.num_tokens
                assert hashes == block_hashes(request.token_ids, 8)[:len(hashes)]
    assert engine.stats().kv_blocks_used == 0


def test_sampling_with_speculation_runs_seeded_and_respects_max_tokens(tiny_model, prompts):
    params = SamplingParams(max_tokens=16, temperature=0.8, top_k=50, seed=3, ignore_eos=True,
                            logprobs=2)
    llm = LLM(str(tiny_model), kv_cache_tokens=2048, block_size=8, speculative=NGRAM)
    first = llm.generate(prompts[:4], params)
    again = llm.generate(prompts[:4], params)
    assert [o.token_ids for o in first] == [o.token_ids for o in again]
    assert all(len(o.token_ids) == 16 and len(o.logprobs) == 16 for o in first)


def test_the_server_flag_passes_the_json_through_to_the_engine():
    from runtime.serve.server import parse_settings

    settings = parse_settings(["--model", "m", "--speculative", '{"method": "ngram", "k": 4, "n": 3}'])
    assert settings.engine_kwargs["speculative"] == {"method": "ngram", "k": 4, "n": 3}
