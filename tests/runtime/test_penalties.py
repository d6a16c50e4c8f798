"""Logits processors (runtime/engine/penalties.py) on hand-made logits, against a per-token loop."""
from __future__ import annotations

import math

import pytest
import torch

from runtime.engine.penalties import History, apply_processors
from runtime.engine.sampler import Sampler
from wire.sampling import SamplingParams

V = 12


def reference(row: torch.Tensor, p: SamplingParams, h: History) -> torch.Tensor:
    """The straightforward version: one token at a time, in the same order."""
    row = row.clone()
    output = list(h.output_token_ids)
    for t in set(h.token_ids):
        if p.repetition_penalty != 1.0:
            row[t] = row[t] / p.repetition_penalty if row[t] > 0 else row[t] * p.repetition_penalty
    for t in set(output):
        row[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    for t, b in p.logit_bias.items():
        row[t] += b
    if len(output) < p.min_tokens:
        for t in list(h.eos_token_ids) + p.stop_token_ids:
            row[t] = -math.inf
    if p.min_p > 0 and p.temperature > 0:
        probs = torch.softmax(row / p.temperature, -1)
        for t in range(V):
            if probs[t] < p.min_p * probs.max():
                row[t] = -math.inf
    return row


CASES = [
    SamplingParams(repetition_penalty=1.7),
    SamplingParams(repetition_penalty=0.6),
    SamplingParams(frequency_penalty=0.8),
    SamplingParams(presence_penalty=-1.5),
    SamplingParams(frequency_penalty=1.1, presence_penalty=0.5, repetition_penalty=1.3),
    SamplingParams(logit_bias={3: 5.0, 7: -100.0}),
    SamplingParams(min_tokens=5, stop_token_ids=[4]),
    SamplingParams(min_tokens=2, stop_token_ids=[4]),     # already past: nothing masked
    SamplingParams(min_p=0.2, temperature=0.7),
    SamplingParams(min_p=0.2, temperature=0.0),           # greedy: min_p changes nothing
    SamplingParams(),                                     # no processor: row untouched
]


def test_every_processor_matches_the_per_token_reference_in_one_batch():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(len(CASES), V, generator=gen) * 3
    histories = [History([1, 2, 2, 9, 3, 3, 3, 1][:4 + i % 4], num_prompt_tokens=2,
                         eos_token_ids=(0,)) for i in range(len(CASES))]
    got = apply_processors(logits, CASES, histories)
    for i, (p, h) in enumerate(zip(CASES, histories)):
        torch.testing.assert_close(got[i], reference(logits[i], p, h), msg=f"case {i}: {p}")
    assert not torch.equal(got[:-2], logits[:-2])        # the cases do change their rows


def test_input_logits_are_left_alone_and_rows_without_history_are_skipped():
    logits = torch.zeros(2, V)
    p = SamplingParams(logit_bias={1: 2.0})
    got = apply_processors(logits, [p, p], [History([5], 1), None])
    assert got[0, 1] == 2.0 and got[1, 1] == 0.0 and logits.abs().sum() == 0


def test_min_p_keeps_exactly_the_tokens_within_the_ratio():
    probs = torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04]])
    got = apply_processors(torch.log(probs), [SamplingParams(min_p=0.15, temperature=1.0)],
                           [History([0], 1)])
    assert torch.isfinite(got).tolist() == [[True, True, True, False, False]]


@pytest.mark.parametrize("bias", [100.0, -100.0])
def test_sampler_follows_logit_bias_greedy_and_sampled(bias):
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=0.0, logit_bias={6: bias}),
              SamplingParams(temperature=1.0, seed=3, logit_bias={6: bias})]
    history = History([1], 1)
    for _ in range(5):
        tokens, _ = Sampler().sample(logits, ["a", "b"], params, [history, history])
        assert (tokens == [6, 6]) if bias > 0 else (6 not in tokens)


def test_frequency_penalty_steers_greedy_away_from_repeats():
    logits = torch.tensor([[0.0, 2.0, 1.9] + [0.0] * (V - 3)])
    p = SamplingParams(temperature=0.0, frequency_penalty=0.5)
    assert Sampler().sample(logits, ["a"], [p], [History([0], 1)])[0] == [1]
    assert Sampler().sample(logits, ["a"], [p], [History([0, 1], 1)])[0] == [2]
