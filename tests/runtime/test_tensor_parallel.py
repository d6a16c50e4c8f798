"""Tensor parallelism with 2 real CPU processes over gloo: the shard arithmetic, greedy
output token for token equal to one rank, each rank holding about half the weights,
and a worker that dies taking the replica down with a reason."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from runtime import LLM, SamplingParams
from runtime.core.config import ModelConfig
from runtime.tensor_parallel.shards import Shard, TensorParallel, check_divisible

pytestmark = pytest.mark.timeout(240)

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=2)
PROMPTS = [list(range(3, 60)), [5, 9, 11], list(range(100, 130)), list(range(3, 40)) + [7, 7, 7]]

# an odd vocabulary (the last rank's slice is padded) and an odd MLP width (uneven split)
UNEVEN = dict(arch="llama", vocab_size=509, intermediate_size=126 + 1)


def config(**changes) -> ModelConfig:
    base = dict(architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=125,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=509)
    return ModelConfig.from_dict({**base, **changes})


# -- the arithmetic, no processes --------------------------------------------------


def test_split_covers_every_item_once_with_uneven_remainder():
    parts = [TensorParallel(r, 3).split(10) for r in range(3)]
    assert parts == [(0, 4), (4, 7), (7, 10)]


def test_vocab_rows_are_equal_sized_and_padded_on_the_last_rank():
    rows = [TensorParallel(r, 2).vocab_rows(509) for r in range(2)]
    assert rows == [(0, 255, 255), (255, 509, 255)]


def test_shard_of_names_rows_or_columns_per_weight():
    cfg = config()                     # head_dim 16, 4 heads, 2 kv heads
    tp = TensorParallel(1, 2)
    p = "model.layers.0."
    assert tp.shard_of(p + "self_attn.q_proj.weight", cfg) == Shard(0, 32, 64)
    assert tp.shard_of(p + "self_attn.q_proj.bias", cfg) == Shard(0, 32, 64)
    assert tp.shard_of(p + "self_attn.k_proj.weight", cfg) == Shard(0, 16, 32)
    assert tp.shard_of(p + "self_attn.o_proj.weight", cfg) == Shard(1, 32, 64)
    assert tp.shard_of(p + "mlp.gate_proj.weight", cfg) == Shard(0, 63, 125)
    assert tp.shard_of(p + "mlp.down_proj.weight", cfg) == Shard(1, 63, 125)
    assert tp.shard_of("model.embed_tokens.weight", cfg) == Shard(0, 255, 509)
    assert tp.shard_of(p + "input_layernorm.weight", cfg) is None
    assert TensorParallel().shard_of(p + "self_attn.q_proj.weight", cfg) is None


def test_heads_that_do_not_divide_are_refused_by_name():
    check_divisible(config(), 2)
    check_divisible(config(), 4)          # more ranks than KV heads: each replicates one
    with pytest.raises(ValueError, match="num_attention_heads"):
        check_divisible(config(num_attention_heads=6, num_key_value_heads=6, hidden_size=96), 4)


def test_engine_refuses_before_starting_any_worker(tiny_model):
    with pytest.raises(ValueError, match="tensor_parallel_size: 3 does not divide"):
        LLM(str(tiny_model), kv_cache_tokens=256, tensor_parallel_size=3)


# -- two processes ---------------------------------------------------------------------


def _run(path, tp: int, **engine):
    with LLM(str(path), kv_cache_tokens=1024, tensor_parallel_size=tp, **engine) as llm:
        outs = llm.generate(PROMPTS, GREEDY)
        again = llm.generate(PROMPTS[:1], GREEDY)[0]      # a prefix-cache hit over the shards
        return outs, again, llm.engine.rank_weight_memory


@pytest.mark.parametrize("name", ["llama_gqa", "qwen2_tied_bias", "uneven", "gemma3"])
def test_two_ranks_match_one_token_for_token(name, arch_model, model_factory):
    path = model_factory(**UNEVEN) if name == "uneven" else arch_model(name)
    one, one_again, (whole,) = _run(path, 1)
    two, two_again, ranks = _run(path, 2)
    for a, b in zip(one + [one_again], two + [two_again]):
        assert b.token_ids == a.token_ids
        for (chosen_a, top_a), (chosen_b, top_b) in zip(a.logprobs, b.logprobs):
            assert [t for t, _ in top_b] == [t for t, _ in top_a]      # the same top-2 ids
            assert chosen_b == pytest.approx(chosen_a, abs=1e-4)
            assert [lp for _, lp in top_b] == pytest.approx([lp for _, lp in top_a], abs=1e-4)
    # the repeat finds every whole block of its prompt cached (16 tokens a block, the last
    # token always computed), on both ranks' shards alike
    assert one_again.num_cached_tokens == two_again.num_cached_tokens == \
        (len(PROMPTS[0]) - 1) // 16 * 16
    # each rank holds its half of every matmul, embedding and head; only norms repeat
    assert len(ranks) == 2
    for rank in ranks:
        assert 0.45 < rank.total_bytes / whole.total_bytes < 0.55
        assert rank.linear_bytes * 2 == pytest.approx(whole.linear_bytes, rel=0.02)


def test_int8_shards_halve_the_quantized_weights(tiny_model):
    _, _, (whole,) = _run(tiny_model, 1, quantization="int8")
    outs, _, ranks = _run(tiny_model, 2, quantization="int8")
    assert [len(o.token_ids) for o in outs] == [GREEDY.max_tokens] * len(PROMPTS)
    for rank in ranks:
        assert 0.45 < rank.linear_bytes / whole.linear_bytes < 0.55


def test_ngram_speculation_verifies_across_ranks(tiny_model):
    spec = {"method": "ngram", "k": 3}
    one, _, _ = _run(tiny_model, 1)
    two, _, _ = _run(tiny_model, 2, speculative=spec)
    assert [o.token_ids for o in two] == [o.token_ids for o in one]


def test_a_dead_worker_fails_the_replica_with_its_reason(tiny_model):
    from runtime.engine.llm_engine import LLMEngine
    from runtime.tensor_parallel.worker_group import WorkerDied

    told = threading.Event()
    reasons: list[str] = []

    def on_failure(reason: str) -> None:
        reasons.append(reason)
        told.set()

    engine = LLMEngine(str(tiny_model), on_worker_failure=on_failure, kv_cache_tokens=256,
                       tensor_parallel_size=2)
    try:
        (pid,) = engine.worker_pids
        engine.add_request("a", [5, 6, 7], GREEDY)
        engine.step()
        os.kill(pid, signal.SIGKILL)
        assert told.wait(30), "the watchdog never reported the dead worker"
        assert f"rank 1 (pid {pid}) exited with code -9" in reasons[0]
        with pytest.raises(WorkerDied, match="rank 1"):
            while engine.has_unfinished_requests():
                engine.step()
    finally:
        engine.close()
