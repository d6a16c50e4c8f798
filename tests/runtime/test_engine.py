"""LLMEngine / LLM behaviour on a tiny real model: cancellation, prefix caching, seeds."""
from __future__ import annotations

import json
import random
import shutil

import pytest

from runtime import LLM, SamplingParams
from runtime.engine.llm_engine import LLMEngine

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_model):
    return LLM(str(tiny_model), kv_cache_tokens=1024, block_size=8, max_num_batched_tokens=64)


def test_abort_frees_blocks_at_the_next_step(tiny_model):
    engine = LLMEngine(str(tiny_model), kv_cache_tokens=256, block_size=8)
    engine.add_request("a", list(range(5, 40)), GREEDY)
    engine.add_request("b", list(range(50, 60)), GREEDY)
    engine.step()
    used = engine.stats().kv_blocks_used
    assert used == engine.block_manager.blocks_needed(35) + engine.block_manager.blocks_needed(10)
    engine.abort_request("a")
    assert engine.stats().kv_blocks_used == used            # not before the next step
    outs = engine.step()
    aborted = [o for o in outs if o.request_id == "a"]
    assert aborted and aborted[0].finished and aborted[0].finish_reason == "abort"
    assert engine.stats().kv_blocks_used < used
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats().kv_blocks_used == 0


def test_prefix_caching_on_and_off_give_identical_tokens(tiny_model):
    rng = random.Random(3)
    system = [rng.randrange(5, 512) for _ in range(40)]
    prompts = [system + [rng.randrange(5, 512) for _ in range(rng.randrange(1, 12))]
               for _ in range(6)]
    prompts.append(list(system))                            # a prompt that is only the prefix
    results = {}
    for caching in (False, True):
        llm = LLM(str(tiny_model), kv_cache_tokens=320, block_size=8, enable_prefix_caching=caching,
                  max_num_batched_tokens=48, max_num_seqs=3)
        first = llm.generate(prompts[:1], GREEDY)          # warm the cache
        outs = first + llm.generate(prompts[1:], GREEDY)
        results[caching] = outs
    assert [o.token_ids for o in results[True]] == [o.token_ids for o in results[False]]
    assert all(o.num_cached_tokens == 0 for o in results[False])
    # the 40-token system prompt is 5 whole blocks of 8; a prompt that is only that prefix
    # leaves its last block to compute (at least one token is always computed)
    assert [o.num_cached_tokens for o in results[True][1:]] == \
        [min(40, (len(p) - 1) // 8 * 8) for p in prompts[1:]]


def test_seeded_sampling_is_the_same_alone_and_in_a_batch(llm):
    params = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.9, top_k=50, seed=1234,
                            ignore_eos=True)
    (alone,) = llm.generate([[5, 6, 7, 8]], params)
    others = SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True)
    batch = llm.generate([[9, 10, 11], [5, 6, 7, 8], list(range(20, 50))], [others, params, GREEDY])
    assert batch[1].token_ids == alone.token_ids
    (again,) = llm.generate([[5, 6, 7, 8]], SamplingParams(**{**params.__dict__, "seed": 99}))
    assert again.token_ids != alone.token_ids


def test_outputs_carry_text_metrics_and_finish_reason(llm):
    import time

    started = time.monotonic()
    (out,) = llm.generate(["Hello, world!"], SamplingParams(max_tokens=5, temperature=0.0,
                                                            ignore_eos=True))
    wall_s = time.monotonic() - started
    assert out.finish_reason == "length" and len(out.token_ids) == 5
    assert out.text == llm.tokenizer.decode(out.token_ids)
    m = out.metrics
    assert m is not None
    # the stages add up to the whole, the whole happened inside this call, and the two
    # stages that ran the model (one prefill, four decode steps) took some time
    assert m.queue_s + m.prefill_s == pytest.approx(m.ttft_s, abs=1e-9)
    assert m.ttft_s + m.decode_s == pytest.approx(m.e2e_s, abs=1e-9)
    assert m.queue_s >= 0 and m.prefill_s > 0 and m.decode_s > 0
    assert m.e2e_s <= wall_s


def test_stop_string_cuts_text_and_finishes_with_stop(llm):
    (probe,) = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=20, temperature=0.0,
                                                         ignore_eos=True))
    text = probe.text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    assert stop.strip(), "the probe text is too short to pick a stop string"
    (out,) = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=20, temperature=0.0,
                                                       ignore_eos=True, stop=[stop]))
    assert out.finish_reason == "stop"
    assert out.text == text[:text.index(stop)]
    assert llm.engine.stats().kv_blocks_used == 0


def test_bad_requests_are_refused_naming_the_field(llm):
    engine = llm.engine
    with pytest.raises(ValueError, match="^prompt"):
        engine.add_request("x", [1, 512], GREEDY)
    with pytest.raises(ValueError, match="^prompt"):
        engine.add_request("x", list(range(5, 5 + 600)), GREEDY)   # longer than the context
    with pytest.raises(ValueError, match="^max_tokens"):
        engine.add_request("x", [5], SamplingParams(max_tokens=0))
    with pytest.raises(ValueError, match="^top_p"):
        engine.add_request("x", [5], SamplingParams(top_p=1.5))
    assert not engine.has_unfinished_requests()


def test_prompt_larger_than_the_whole_cache_is_refused(tiny_model):
    engine = LLMEngine(str(tiny_model), kv_cache_tokens=32, block_size=8)
    with pytest.raises(ValueError, match="^prompt: .*KV cache|^prompt: .*context"):
        engine.add_request("x", list(range(5, 45)), GREEDY)


def test_unknown_architecture_is_rejected_by_name(tiny_model, tmp_path):
    folder = tmp_path / "gpt2ish"
    shutil.copytree(tiny_model, folder)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        LLM(str(folder))


def test_kv_cache_sized_from_memory_when_not_given(tiny_model):
    engine = LLMEngine(str(tiny_model), max_num_seqs=4)
    assert engine.stats().kv_blocks_total == 4 * 512 // 16   # capped at what 4 seqs can use
    assert engine.max_model_len == 512
    assert set(engine.load_timings) >= {"weights", "pack", "kv_cache"}


def test_importing_runtime_does_not_import_torch():
    import subprocess
    import sys
    code = "import runtime, sys; from runtime import SamplingParams; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def _serve(engine, prompts, params, cancel_at):
    """Run everything to the end; abort request ids when their step number comes."""
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    tokens = {str(i): [] for i in range(len(prompts))}
    for step in range(10_000):
        if not engine.has_unfinished_requests():
            break
        for rid, at in cancel_at.items():
            if at == step:
                engine.abort_request(rid)
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    return tokens


@pytest.mark.parametrize("seed", [0, 1])
def test_prefix_caching_exact_under_preemption_and_cancellation(tiny_model, seed):
    rng = random.Random(seed)
    bases = [[rng.randrange(5, 512) for _ in range(48)] for _ in range(2)]
    prompts = [rng.choice(bases)[:rng.randrange(8, 49)] + [rng.randrange(5, 512)
               for _ in range(rng.randrange(0, 10))] for _ in range(12)]
    cancel_at = {str(i): rng.randrange(1, 12) for i in rng.sample(range(12), 3)}
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    runs = {}
    for caching in (False, True):
        engine = LLMEngine(str(tiny_model), kv_cache_tokens=112, block_size=8, max_num_seqs=6,
                           max_num_batched_tokens=40, enable_prefix_caching=caching)
        runs[caching] = _serve(engine, prompts, params, cancel_at)
        assert engine.stats().kv_blocks_used == 0
        engine.block_manager.check_invariants()
        if caching:
            assert engine.stats().prefix_cache_hits > 0 and engine.stats().num_preemptions > 0
    kept = [rid for rid in runs[False] if rid not in cancel_at]
    assert [runs[True][r] for r in kept] == [runs[False][r] for r in kept]
    assert all(len(runs[True][r]) == 10 for r in kept)


# bf16 keeps 8 bits of mantissa: over this 2-layer model the logprobs move by about 0.01
# (0.013 at most, measured), while a wrong weight or a wrong cast moves them by a whole nat.
BF16_LOGPROB_TOL = 0.05


def test_bfloat16_weights_load_and_generate(tiny_model, hf_oracle):
    """bf16 logprobs agree with float32 transformers, teacher-forced on bf16's own tokens,
    and each greedy bf16 pick is float32's best token or within bf16's error of it."""
    import torch
    llm = LLM(str(tiny_model), dtype="bfloat16", kv_cache_tokens=256)
    assert llm.engine.runner.model.embed.dtype == torch.bfloat16
    prompt = [5, 6, 7]
    (out,) = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0.0,
                                                   ignore_eos=True, logprobs=2))
    assert len(out.token_ids) == 8 and len(out.logprobs) == 8
    with torch.no_grad():
        logits = hf_oracle(str(tiny_model))(torch.tensor([prompt + out.token_ids])).logits[0]
    ref = torch.log_softmax(logits.float(), dim=-1)[len(prompt) - 1:len(prompt) - 1 + 8]
    for step, (token, (chosen, top)) in enumerate(zip(out.token_ids, out.logprobs)):
        assert chosen == pytest.approx(ref[step, token].item(), abs=BF16_LOGPROB_TOL), step
        assert ref[step].max().item() - ref[step, token].item() <= 2 * BF16_LOGPROB_TOL, step
        assert len(top) == 2 and top[0][0] == token
        for candidate, value in top:
            assert value == pytest.approx(ref[step, candidate].item(), abs=BF16_LOGPROB_TOL)


def test_unknown_engine_option_is_refused_by_name(tiny_model):
    with pytest.raises(ValueError, match="^warp_speed"):
        LLMEngine(str(tiny_model), warp_speed=9)


def test_requests_added_between_steps_join_the_running_batch(tiny_model):
    """Only the thread that steps adds (the engine core's CoreLoop applies the server's adds
    between steps); a duplicate id is refused while the first one is held."""
    engine = LLMEngine(str(tiny_model), kv_cache_tokens=512, block_size=8)
    done = set()
    for i in range(20):
        engine.add_request(f"t{i}", [5 + i, 6, 7], GREEDY)
        done |= {o.request_id for o in engine.step() if o.finished}
    assert engine.stats().num_running > 1   # later ones joined while earlier ones ran
    while engine.has_unfinished_requests():
        done |= {o.request_id for o in engine.step() if o.finished}
    assert done == {f"t{i}" for i in range(20)}
    engine.add_request("x", [5], GREEDY)
    with pytest.raises(ValueError, match="^request_id"):
        engine.add_request("x", [5], GREEDY)


def test_an_abort_of_a_finished_id_spares_the_next_request_with_that_id(tiny_model):
    engine = LLMEngine(str(tiny_model), kv_cache_tokens=256, block_size=8)
    engine.add_request("a", [5, 6, 7], SamplingParams(max_tokens=1, temperature=0.0))
    while engine.has_unfinished_requests():
        engine.step()
    engine.abort_request("a")                   # too late: it finished
    engine.add_request("a", [5, 6, 7], GREEDY)  # the id is free again
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert outs[-1].finish_reason == "length"
    assert sum(len(o.new_token_ids) for o in outs) == GREEDY.max_tokens
