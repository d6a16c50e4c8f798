"""Sampler alone on hand-made logits."""
from __future__ import annotations

import torch

from runtime.engine.sampler import Sampler, filter_logits
from wire.sampling import SamplingParams

LOGITS = torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0],
                       [5.0, 0.0, 0.0, 0.0, 6.0]])


def test_greedy_is_argmax_and_logprobs_are_log_softmax():
    tokens, lps = Sampler().sample(LOGITS, ["a", "b"], [SamplingParams(temperature=0.0, logprobs=2),
                                                        SamplingParams(temperature=0.0)])
    assert tokens == [1, 4]
    chosen, top = lps[0]
    ref = torch.log_softmax(LOGITS[0], -1)
    assert abs(chosen - ref[1].item()) < 1e-6
    assert [t for t, _ in top] == [1, 3]
    assert lps[1] is None


def test_top_k_and_top_p_cut_the_tail():
    row = LOGITS[0]
    assert torch.isinf(filter_logits(row, 2, 1.0)).tolist() == [True, False, True, False, True]
    probs = torch.softmax(row, -1)                    # [.03, .64, .09, .23, .01]
    kept = ~torch.isinf(filter_logits(row, 0, 0.7))
    assert kept.tolist() == [False, True, False, True, False]
    assert probs[1] < 0.7 <= probs[1] + probs[3]
    assert (~torch.isinf(filter_logits(row, 0, 0.01))).sum() == 1   # always keeps the top


def test_seed_reproduces_regardless_of_neighbours():
    p = SamplingParams(temperature=1.0, seed=7)
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(0))
    alone, batched = Sampler(), Sampler(seed=5)
    seq_alone = [alone.sample(logits, ["r"], [p])[0][0] for _ in range(20)]
    other = SamplingParams(temperature=1.0)
    seq_batched = []
    for _ in range(20):
        tokens, _ = batched.sample(torch.cat([logits, logits]), ["x", "r"], [other, p])
        seq_batched.append(tokens[1])
    assert seq_alone == seq_batched
    assert len(set(seq_alone)) > 1


def test_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))
    s = Sampler(seed=1)
    counts = [0, 0, 0]
    for i in range(3000):
        counts[s.sample(logits, [str(i)], [SamplingParams(temperature=1.0)])[0][0]] += 1
    assert abs(counts[0] / 3000 - 0.7) < 0.04 and abs(counts[2] / 3000 - 0.1) < 0.03


def test_release_forgets_generators():
    s = Sampler()
    p = SamplingParams(temperature=1.0, seed=3)
    first = [s.sample(LOGITS[:1], ["r"], [p])[0][0] for _ in range(8)]
    s.release(["r"])
    assert [s.sample(LOGITS[:1], ["r"], [p])[0][0] for _ in range(8)] == first
