"""TP with replicated KV heads: with more ranks than KV heads (MQA, or GQA with few KV
heads) each rank keeps the one KV head its query heads read, as vLLM does; greedy
output token for token equal to one rank, and a clear refusal where neither count
divides the other."""
from __future__ import annotations

import pytest
import torch

from runtime import LLM, SamplingParams
from runtime.core.config import ModelConfig
from runtime.models import model_class
from runtime.tensor_parallel.shards import Shard, TensorParallel, check_divisible
from spec.tensor_parallel import kv_heads_refusal

pytestmark = pytest.mark.timeout(240)

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPTS = [list(range(3, 40)), [5, 9, 11], list(range(100, 120))]   # one batched step each


def config(heads: int = 4, kv_heads: int = 1) -> ModelConfig:
    return ModelConfig.from_dict(dict(architectures=["LlamaForCausalLM"], hidden_size=64,
                                      intermediate_size=128, num_hidden_layers=2, vocab_size=512,
                                      num_attention_heads=heads, num_key_value_heads=kv_heads))


# -- the arithmetic, no processes --------------------------------------------------


@pytest.mark.parametrize("heads, kv_heads, size, expected", [
    (8, 4, 2, [(0, 2), (2, 4)]),                       # fewer ranks: split as before
    (4, 1, 2, [(0, 1), (0, 1)]),                       # MQA: every rank the one head
    (8, 2, 4, [(0, 1), (0, 1), (1, 2), (1, 2)]),       # GQA: 2 ranks share each head
    (16, 4, 8, [(r // 2, r // 2 + 1) for r in range(8)]),
])
def test_each_rank_holds_the_kv_head_its_query_heads_read(heads, kv_heads, size, expected):
    ranks = [TensorParallel(r, size) for r in range(size)]
    assert [tp.kv_heads(kv_heads) for tp in ranks] == expected
    group = heads // kv_heads                          # query heads per KV head
    for tp, (start, stop) in zip(ranks, expected):
        q_start, q_stop = tp.split(heads)
        assert (q_start // group, -(-q_stop // group)) == (start, stop)


def test_replicated_k_and_v_rows_are_the_ranks_head():
    cfg = config(heads=8, kv_heads=2)                  # head_dim 8
    p = "model.layers.0.self_attn."
    for rank, rows in [(1, Shard(0, 0, 8)), (2, Shard(0, 8, 16))]:
        tp = TensorParallel(rank, 4)
        assert tp.shard_of(p + "k_proj.weight", cfg) == rows
        assert tp.shard_of(p + "v_proj.bias", cfg) == rows
        assert tp.shard_of(p + "q_proj.weight", cfg) == Shard(0, rank * 16, rank * 16 + 16)


def test_kv_cache_accounting_counts_one_head_per_rank():
    cfg = config(heads=4, kv_heads=2)
    llama = model_class("LlamaForCausalLM")
    whole = llama(cfg, torch.float32, "cpu").kv_bytes_per_token()
    rank = llama(cfg, torch.float32, "cpu", tp=TensorParallel(3, 4))
    assert rank.num_kv_heads == 1
    assert rank.kv_bytes_per_token() * 2 == whole


def test_counts_that_neither_divide_are_refused_naming_both():
    assert kv_heads_refusal(1, 4) is None and kv_heads_refusal(4, 2) is None
    check_divisible(config(heads=4, kv_heads=1), 4)
    with pytest.raises(ValueError, match=r"tensor_parallel_size: 3 and the model's "
                                         r"num_key_value_heads \(2\): neither divides the other"):
        check_divisible(config(heads=6, kv_heads=2), 3)
    with pytest.raises(ValueError, match=r"4 and the model's num_key_value_heads \(6\)"):
        check_divisible(config(heads=12, kv_heads=6), 4)


# -- real ranks over gloo ---------------------------------------------------------


def _generate(path, tp: int) -> tuple[list[list[int]], int]:
    """(greedy ids per prompt, KV heads in rank 0's cache)."""
    with LLM(str(path), kv_cache_tokens=256, tensor_parallel_size=tp) as llm:
        outs = llm.generate(PROMPTS, GREEDY)
        k_cache, _ = llm.engine.runner.kv_caches[0]    # [blocks, block_size, heads, D]
        return [o.token_ids for o in outs], k_cache.shape[-2]


@pytest.mark.parametrize("spec, tp", [
    (dict(arch="llama", num_key_value_heads=1), 2),                          # MQA
    (dict(arch="qwen2", num_key_value_heads=1), 2),                          # MQA, k/v biases
    (dict(arch="llama", num_attention_heads=8, num_key_value_heads=2), 4),   # GQA, 2 ranks a head
])
def test_replicated_kv_heads_match_one_rank_token_for_token(spec, tp, model_factory):
    path = model_factory(**spec)
    one, heads_one = _generate(path, 1)
    many, heads_many = _generate(path, tp)
    assert many == one
    assert (heads_one, heads_many) == (spec["num_key_value_heads"], 1)
