"""Scheduler with no model: a fake runner answers every sampled chunk with a token."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.engine.block_manager import BlockManager
from runtime.engine.request import Request
from wire.sampling import SamplingParams
from runtime.engine.scheduler import RunnerOutput, Scheduler, SchedulerConfig

EOS = 2


def make(num_blocks=16, block_size=4, budget=16, max_seqs=8, max_len=64, caching=True):
    bm = BlockManager(num_blocks, block_size, caching)
    return Scheduler(SchedulerConfig(max_seqs, budget, max_len), bm), bm


def req(rid, n_prompt, max_tokens=4, first=10):
    return Request(rid, list(range(first, first + n_prompt)),
                   SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                   arrival_time=0.0, eos_token_ids=(EOS,))


def fake_run(out, token=7):
    return RunnerOutput(token_ids={c.request_id: [token] for c in out.chunks if c.sample})


def step(s, now=0.0, token=7):
    out = s.schedule(now)
    return out, s.postprocess(out, fake_run(out, token), now)


def test_chunked_prefill_samples_only_after_the_last_chunk():
    s, _ = make(budget=8)
    s.add(req("a", 20))
    sizes = []
    for _ in range(3):
        out, deltas = step(s)
        (chunk,) = out.chunks
        sizes.append((len(chunk.token_ids), chunk.start, chunk.sample))
    assert sizes == [(8, 0, False), (8, 8, False), (4, 16, True)]
    assert len(deltas) == 1 and deltas[0].new_token_ids == [7]


def test_prefill_and_decode_share_a_step():
    s, _ = make(budget=16)
    s.add(req("a", 6))
    step(s)
    s.add(req("b", 30))
    out, _ = step(s)
    assert [(c.request_id, len(c.token_ids)) for c in out.chunks] == [("a", 1), ("b", 15)]


def test_max_num_seqs_limits_running():
    s, _ = make(max_seqs=2)
    for rid in "abc":
        s.add(req(rid, 3))
    out, _ = step(s)
    assert [c.request_id for c in out.chunks] == ["a", "b"]
    assert [r.request_id for r in s.waiting] == ["c"]


def test_newest_is_preempted_by_recompute_and_both_finish():
    s, bm = make(num_blocks=4, block_size=4, budget=64, max_len=16)
    s.add(req("old", 6, max_tokens=6))
    s.add(req("new", 6, max_tokens=6, first=40))
    finished, preempted = {}, []
    for _ in range(40):
        out, deltas = step(s)
        preempted += out.preempted
        finished.update({d.request_id: d.finish_reason for d in deltas if d.finished})
        bm.check_invariants()
        if not s.has_unfinished():
            break
    assert preempted and preempted[0] == "new"
    assert finished == {"old": "length", "new": "length"}
    assert bm.num_free_blocks == 4


def test_recompute_after_preemption_includes_generated_tokens():
    s, _ = make(num_blocks=4, block_size=4, budget=64, max_len=16, caching=False)
    old, new = req("old", 6, max_tokens=6), req("new", 6, max_tokens=6, first=40)
    s.add(old)
    s.add(new)
    for _ in range(50):                  # 4 blocks for two 12-token requests: it must come
        if new.num_preemptions:
            break
        step(s)
    else:
        pytest.fail("new was never preempted")
    generated = new.num_output_tokens
    for _ in range(50):
        out, _ = step(s)
        if new.status.value != "waiting":
            break
    else:
        pytest.fail("new was never resumed")
    chunk = next(c for c in out.chunks if c.request_id == "new")
    assert chunk.start == 0 and len(chunk.token_ids) == 6 + generated


def test_prompts_that_never_fit_are_refused_up_front():
    s, _ = make(num_blocks=4, block_size=4, max_len=64)
    with pytest.raises(ValueError, match="^prompt: .*whole KV cache"):
        s.add(req("a", 16))
    s2, _ = make(max_len=10)
    with pytest.raises(ValueError, match="^prompt: .*context of 10"):
        s2.add(req("a", 10))


def test_stop_conditions_eos_stop_token_and_max_len():
    s, _ = make(max_len=9)
    r = req("a", 3, max_tokens=100)
    r.params.ignore_eos = False
    s.add(r)
    _, deltas = step(s, token=EOS)
    assert deltas[0].finished and deltas[0].finish_reason == "stop"
    s.add(req("b", 6, max_tokens=100))
    reasons = []
    for _ in range(5):
        _, deltas = step(s)
        reasons += [d.finish_reason for d in deltas]
    assert reasons == [None, None, "length"]          # 6 + 3 = max_len


def test_abort_frees_blocks_and_is_reported_to_the_runner():
    s, bm = make()
    s.add(req("a", 9))
    step(s)
    assert bm.num_used_blocks == 3
    s.abort("a", now=1.0)
    assert bm.num_used_blocks == 0 and not s.has_unfinished()
    out = s.schedule(2.0)
    assert out.finished == ["a"]


def test_prefix_hits_are_counted_and_skip_computation():
    s, _ = make(budget=64)
    s.add(req("a", 9, max_tokens=1))
    step(s)
    s.add(req("b", 9, max_tokens=1))
    out, deltas = step(s)
    (chunk,) = out.chunks
    assert chunk.start == 8 and len(chunk.token_ids) == 1
    assert deltas[0].num_cached_tokens == 8
    assert (s.stats.prefix_cache_queries, s.stats.prefix_cache_hits) == (18, 8)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_arrivals_and_cancellations_never_leak(data):
    caching = data.draw(st.booleans())
    s, bm = make(num_blocks=12, block_size=4, budget=data.draw(st.integers(1, 24)),
                 max_seqs=data.draw(st.integers(1, 6)), max_len=40, caching=caching)
    bases = [list(range(100, 124)), list(range(200, 224))]
    next_id, live = 0, []
    for _ in range(data.draw(st.integers(1, 60))):
        action = data.draw(st.sampled_from(["add", "add", "abort", "step", "step", "step"]))
        if action == "add":
            base = data.draw(st.sampled_from(bases))
            prompt = base[:data.draw(st.integers(1, 24))] + data.draw(
                st.lists(st.integers(0, 50), max_size=8))
            r = Request(str(next_id), prompt, SamplingParams(
                max_tokens=data.draw(st.integers(1, 12)), ignore_eos=True), 0.0)
            next_id += 1
            try:
                s.add(r)
                live.append(r.request_id)
            except ValueError:
                assert len(prompt) >= 40 or bm.blocks_needed(len(prompt) + 1) > 12
        elif action == "abort" and live:
            s.abort(data.draw(st.sampled_from(live)), 0.0)
        else:
            step(s, token=data.draw(st.integers(0, 50)))
        live = [rid for rid in live if rid in s.requests]
        bm.check_invariants()
    for _ in range(2000):                   # bounded: everything must drain
        if not s.has_unfinished():
            break
        out, _ = step(s)
        assert out.chunks, "no progress: deadlock"
        bm.check_invariants()
    assert not s.has_unfinished()
    assert bm.num_free_blocks == bm.num_blocks


def test_a_sliding_window_bounds_the_blocks_a_long_request_holds():
    bm = BlockManager(16, 4, sliding_window=8)
    s = Scheduler(SchedulerConfig(8, 16, 64), bm)
    s.add(req("a", 30, max_tokens=20))
    used = []
    while s.has_unfinished():
        step(s)
        used.append(bm.num_used_blocks)
    # 50 tokens would take 13 blocks; after each step only the blocks of the next query's
    # window (its 7 predecessors and its own slot) are held: 2 or 3 of 4 tokens
    assert used[:3] == [2, 3, 2] and max(used) == 3
    assert bm.num_used_blocks == 0
    bm.check_invariants()
