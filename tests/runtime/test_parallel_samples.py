"""n > 1: the prompt is computed once and its blocks are shared by the samples (fork, copy on
write of the partial last block); seeded samples repeat; aborts end unforked samples."""
from __future__ import annotations

import pytest

from runtime import LLM, SamplingParams
from runtime.engine.block_manager import BlockManager

PROMPT = list(range(3, 40))          # 37 tokens: two full blocks of 16 and a partial one


def test_fork_shares_full_blocks_and_copies_the_partial_one():
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate("a", [], 10)                     # blocks 0, 1 full; 2 partial
    assert bm.fork("a", "a/1", 10) == (2, 3)     # a fresh block 3 for the copy of block 2
    assert bm.block_table("a/1") == [0, 1, 3]
    assert bm.fork("a", "a/2", 8) is None        # a block boundary: nothing to copy
    assert bm.block_table("a/2") == [0, 1]
    assert bm.num_free_blocks == 4
    bm.check_invariants()
    for request_id in ("a", "a/1", "a/2"):
        bm.deallocate(request_id)
    assert bm.num_free_blocks == 8
    bm.check_invariants()


def test_can_fork_needs_a_block_only_for_a_partial_tail():
    bm = BlockManager(num_blocks=2, block_size=4)
    bm.allocate("a", [], 8)
    assert bm.can_fork(8) and not bm.can_fork(7)


@pytest.fixture(scope="module")
def llm(tiny_model):
    import torch

    torch.set_num_threads(1)
    return LLM(str(tiny_model), kv_cache_tokens=1024, block_size=16, enable_prefix_caching=False)


def test_samples_share_the_prompt_blocks_instead_of_recomputing(llm):
    engine = llm.engine
    engine.add_request("r", PROMPT, SamplingParams(n=4, max_tokens=4, temperature=1.0, seed=1))
    engine.step()                                       # the prompt, once, and 4 first tokens
    tables = [engine.block_manager.block_table(i) for i in ("r", "r/1", "r/2", "r/3")]
    assert all(t[:2] == tables[0][:2] for t in tables)   # the full blocks: shared
    assert len({t[2] for t in tables}) == 4              # the partial one: a copy each
    assert engine.block_manager.num_used_blocks == 2 + 4
    computed = [engine.scheduler.requests[i].num_computed_tokens for i in ("r", "r/1", "r/2", "r/3")]
    assert computed == [len(PROMPT)] * 4
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.block_manager.num_used_blocks == 0
    engine.block_manager.check_invariants()


def test_greedy_samples_equal_the_single_answer(llm):
    """A sample reads its copy of the partial block: a wrong copy changes its tokens."""
    one = llm.generate([PROMPT], SamplingParams(max_tokens=12, temperature=0.0))[0]
    many = llm.generate([PROMPT], SamplingParams(n=3, max_tokens=12, temperature=0.0))
    assert [o.token_ids for o in many] == [one.token_ids] * 3


def test_seeded_samples_repeat_and_differ_from_each_other(llm):
    params = SamplingParams(n=3, max_tokens=10, temperature=1.0, seed=11)
    first = [o.token_ids for o in llm.generate([PROMPT], params)]
    noise = SamplingParams(max_tokens=6, temperature=1.0)
    again = [o.token_ids for o in llm.generate([PROMPT[:20], PROMPT], [noise, params])[1:]]
    assert first == again
    assert len({tuple(t) for t in first}) == 3
    alone = llm.generate([PROMPT], SamplingParams(max_tokens=10, temperature=1.0, seed=11))[0]
    assert alone.token_ids == first[0]                  # sample 0 keeps the request's own seed


def test_abort_before_the_prompt_ran_ends_every_sample(llm):
    engine = llm.engine
    engine.add_request("x", PROMPT, SamplingParams(n=3, max_tokens=4))
    engine.abort_request("x")
    outs = engine.step()
    assert sorted((o.request_id, o.finish_reason) for o in outs) == [
        ("x", "abort"), ("x/1", "abort"), ("x/2", "abort")]
    assert not engine.has_unfinished_requests()


def test_a_sample_aborted_before_the_fork_is_not_forked(llm):
    engine = llm.engine
    engine.add_request("y", PROMPT, SamplingParams(n=3, max_tokens=3))
    engine.abort_request("y/2")
    outs = engine.step()
    assert [(o.request_id, o.finish_reason) for o in outs if o.finished] == [("y/2", "abort")]
    assert "y/2" not in engine.scheduler.requests and "y/1" in engine.scheduler.requests
    while engine.has_unfinished_requests():
        engine.step()
    engine.block_manager.check_invariants()


def test_speculative_engines_refuse_samples_and_processors_by_name():
    from runtime.engine.llm_engine import check_plain_sampling

    with pytest.raises(ValueError, match="^n:"):
        check_plain_sampling(SamplingParams(n=2))
    with pytest.raises(ValueError, match="^logit_bias:"):
        check_plain_sampling(SamplingParams(logit_bias={3: 1.0}))
    check_plain_sampling(SamplingParams())
