"""Prompt and output lengths per kind meet the Azure LLM inference trace's quartiles."""
import numpy as np
import pytest

from poolsim.lengths import CHAT, CODE, LengthModel, draw_lengths, sigma_from_quartiles

# (q25, median, q75) of AzureLLMInferenceTrace_{code,conv}.csv, 2023
PUBLISHED = {
    "code": ((578, 1469, 2745), (9, 13, 24)),
    "chat": ((396, 1020, 1189), (85, 129, 395)),
}


@pytest.mark.parametrize("kind, model", [("code", CODE), ("chat", CHAT)])
def test_median_and_quartile_spread_meet_the_trace(kind, model):
    """The fit promises the median and q75 / q25; not each quartile, which the trace skews."""
    prompts, outputs = draw_lengths(np.random.default_rng(1), model, 200_000)
    for drawn, (q25, median, q75) in zip((prompts, outputs), PUBLISHED[kind]):
        drawn_q25, drawn_median, drawn_q75 = np.percentile(drawn, [25, 50, 75])
        assert drawn_median == pytest.approx(median, rel=0.03, abs=1), (kind, drawn_median, median)
        # 10%: short outputs round to whole tokens (13 with q25 9)
        assert drawn_q75 / drawn_q25 == pytest.approx(q75 / q25, rel=0.10), (kind, drawn_q25, drawn_q75)


def test_code_prompts_are_longer_and_outputs_shorter_than_chat():
    rng = np.random.default_rng(2)
    code_prompts, code_outputs = draw_lengths(rng, CODE, 50_000)
    chat_prompts, chat_outputs = draw_lengths(rng, CHAT, 50_000)
    assert np.median(code_prompts) > np.median(chat_prompts)
    assert np.median(code_outputs) * 5 < np.median(chat_outputs)


def test_lengths_are_clipped_to_their_bounds():
    wide = LengthModel(prompt_median=1000, prompt_sigma=3.0, output_median=100, output_sigma=3.0,
                       max_prompt_tokens=2048, max_output_tokens=256)
    prompts, outputs = draw_lengths(np.random.default_rng(3), wide, 20_000)
    assert prompts.dtype == np.int64 and outputs.dtype == np.int64
    assert prompts.min() == 1 and prompts.max() == 2048
    assert outputs.min() == 1 and outputs.max() == 256


def test_sigma_from_quartiles():
    assert sigma_from_quartiles(1.0, np.exp(1.349)) == pytest.approx(1.0)
