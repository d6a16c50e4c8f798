"""The scheduler under the `priority` policy (runtime/engine/serve_order.py), with no model:
admission by (priority, arrival), the worst request preempted first, a waiting request of
a better class displacing a running one, and `fcfs` unchanged for equal priorities."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.engine.block_manager import BlockManager
from runtime.engine.request import Request
from runtime.engine.scheduler import RunnerOutput, Scheduler, SchedulerConfig
from runtime.engine.serve_order import ServeOrder
from wire.priority import BATCH_PRIORITY, INTERACTIVE_PRIORITY
from wire.sampling import SamplingParams

BATCH, INTERACTIVE = BATCH_PRIORITY, INTERACTIVE_PRIORITY


def make(policy="priority", num_blocks=16, block_size=4, budget=64, max_seqs=8, max_len=64):
    bm = BlockManager(num_blocks, block_size, True)
    return Scheduler(SchedulerConfig(max_seqs, budget, max_len, policy=policy), bm), bm


def req(rid, n_prompt=6, priority=INTERACTIVE, max_tokens=4, first=10):
    return Request(rid, list(range(first, first + n_prompt)),
                   SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                   arrival_time=0.0, priority=priority)


def step(s, now=0.0):
    out = s.schedule(now)
    result = RunnerOutput(token_ids={c.request_id: [7] for c in out.chunks if c.sample})
    return out, s.postprocess(out, result, now)


def first_scheduled(s, steps=50):
    """Request ids in the order they were first given a chunk."""
    seen: list[str] = []
    for _ in range(steps):
        out, _ = step(s)
        seen += [c.request_id for c in out.chunks if c.request_id not in seen]
        if not s.has_unfinished():
            break
    return seen


def test_waiting_requests_are_admitted_by_priority_then_arrival():
    s, _ = make(max_seqs=1)
    for rid, prio in [("b1", BATCH), ("i1", INTERACTIVE), ("b2", BATCH), ("i2", INTERACTIVE), ("x", -5)]:
        s.add(req(rid, priority=prio, first=10 + 10 * len(s.requests)))
    assert first_scheduled(s) == ["x", "i1", "i2", "b1", "b2"]


def test_fcfs_ignores_priority():
    s, _ = make("fcfs", max_seqs=1)
    for rid, prio in [("b1", BATCH), ("i1", INTERACTIVE), ("b2", BATCH)]:
        s.add(req(rid, priority=prio, first=10 + 10 * len(s.requests)))
    assert first_scheduled(s) == ["b1", "i1", "b2"]


@pytest.mark.parametrize("policy, victim", [("priority", "batch"), ("fcfs", "late")])
def test_the_worst_running_request_is_preempted_when_blocks_run_out(policy, victim):
    # 6 blocks of 4: three prompts of 6 tokens take 2 each; the first decode past 8 tokens
    # needs a third block, and one request must give its blocks back
    s, bm = make(policy, num_blocks=6)
    s.add(req("early", priority=INTERACTIVE, max_tokens=6))
    s.add(req("batch", priority=BATCH, max_tokens=6, first=30))
    s.add(req("late", priority=INTERACTIVE, max_tokens=6, first=50))
    preempted: list[str] = []
    while s.has_unfinished():
        out, _ = step(s)
        preempted += out.preempted
        bm.check_invariants()
    assert preempted[0] == victim
    assert bm.num_free_blocks == 6


def test_an_interactive_request_displaces_a_running_batch_one_when_no_slot_is_free():
    s, _ = make(max_seqs=2)
    s.add(req("b1", priority=BATCH, max_tokens=20))
    s.add(req("b2", priority=BATCH, max_tokens=20, first=30))
    step(s)
    s.add(req("i", priority=INTERACTIVE, max_tokens=2, first=50))
    out, _ = step(s)
    assert out.preempted == ["b2"]                  # the worst: the later of the batch class
    assert [c.request_id for c in out.chunks] == ["i"]   # its prefill step carries no batch work
    assert [r.request_id for r in s.running] == ["i", "b1"]   # best first
    assert [r.request_id for r in s.waiting] == ["b2"]
    out, _ = step(s)
    assert [c.request_id for c in out.chunks] == ["i", "b1"], "the next step runs both classes"


def test_an_interactive_request_displaces_batch_requests_when_blocks_run_out():
    s, bm = make(num_blocks=4, max_seqs=8)
    s.add(req("b1", n_prompt=8, priority=BATCH, max_tokens=3))
    s.add(req("b2", n_prompt=7, priority=BATCH, max_tokens=3, first=30))
    step(s)                                         # both prefilled: every block taken
    s.add(req("i", n_prompt=8, priority=INTERACTIVE, max_tokens=2, first=50))
    out, _ = step(s)
    # b2 gives i its blocks; b1 sits out i's prefill step (its next token would need a
    # block nobody has left), and is preempted when it asks for one
    assert out.preempted == ["b2"]
    assert [c.request_id for c in out.chunks] == ["i"]
    while s.has_unfinished():
        step(s)
        bm.check_invariants()
    assert bm.num_free_blocks == 4


def test_equals_never_displace_each_other():
    s, _ = make(max_seqs=1)
    s.add(req("b1", priority=BATCH, max_tokens=5))
    step(s)
    s.add(req("b2", priority=BATCH, first=30))
    out, _ = step(s)
    assert out.preempted == [] and [c.request_id for c in out.chunks] == ["b1"]


def test_fcfs_never_displaces():
    s, _ = make("fcfs", max_seqs=1)
    s.add(req("b", priority=BATCH, max_tokens=5))
    step(s)
    s.add(req("i", priority=INTERACTIVE, first=30))
    out, _ = step(s)
    assert out.preempted == [] and [c.request_id for c in out.chunks] == ["b"]


def test_a_preempted_request_goes_back_in_front_of_its_class_only():
    order = ServeOrder("priority")
    waiting: list[Request] = []
    for rid, prio in [("i1", INTERACTIVE), ("b1", BATCH)]:
        order.arrive(waiting, req(rid, priority=prio))
    order.requeue(waiting, req("b0", priority=BATCH))
    order.requeue(waiting, req("i0", priority=INTERACTIVE))
    assert [r.request_id for r in waiting] == ["i0", "i1", "b0", "b1"]


def test_an_unknown_policy_is_refused_by_name():
    with pytest.raises(ValueError, match="scheduling_policy"):
        ServeOrder("lifo")


def _trace(policy, ops, priorities):
    """Every step's chunks and preemptions for one sequence of arrivals and steps."""
    s, bm = make(policy, num_blocks=10, budget=12, max_seqs=3, max_len=40)
    trace, n = [], 0
    for op in ops:
        if op == "add":
            s.add(req(f"r{n}", n_prompt=3 + 2 * (n % 5), priority=priorities[n % len(priorities)],
                      max_tokens=2 + n % 4, first=10 + 7 * n))
            n += 1
        else:
            out, _ = step(s)
            trace.append(([(c.request_id, c.start, len(c.token_ids)) for c in out.chunks], out.preempted))
            bm.check_invariants()
    while s.has_unfinished():
        out, _ = step(s)
        trace.append(([(c.request_id, c.start, len(c.token_ids)) for c in out.chunks], out.preempted))
    return trace


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["add", "step"]), min_size=1, max_size=40), st.integers(-3, 3))
def test_one_priority_for_all_is_served_exactly_as_fcfs(ops, priority):
    assert _trace("priority", ops, [priority]) == _trace("fcfs", ops, [priority])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["add", "step"]), min_size=1, max_size=40),
       st.lists(st.sampled_from([INTERACTIVE, BATCH, -1]), min_size=1, max_size=5))
def test_mixed_priorities_finish_everything_and_leak_nothing(ops, priorities):
    trace = _trace("priority", ops, priorities)
    finished = {rid for chunks, _ in trace for rid, _, _ in chunks}
    assert finished == {f"r{i}" for i in range(ops.count("add"))}


def test_llm_generate_admits_by_the_priority_given_per_prompt(tiny_model):
    """LLM.generate(priority=...), as vLLM's offline API takes it: one sequence at a time,
    the interactive prompt is admitted first, then the batch ones in their order; the
    outputs stay in the prompts' order; a list of another length is refused."""
    from runtime import LLM

    llm = LLM(str(tiny_model), kv_cache_tokens=256, max_num_seqs=1, scheduling_policy="priority")
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    prompts = [[10, 11, 12], [20, 21, 22], [30, 31, 32]]
    outs = llm.generate(prompts, params, priority=[BATCH, INTERACTIVE, BATCH])
    assert [o.prompt_token_ids for o in outs] == prompts
    queued = [o.metrics.queue_s for o in outs]
    assert queued[1] < queued[0] < queued[2], queued
    fcfs = llm.generate(prompts, params, priority=INTERACTIVE)
    assert [o.token_ids for o in fcfs] == [o.token_ids for o in outs], "priority orders, it does not change"
    with pytest.raises(ValueError, match="priority: 2 values for 3 prompts"):
        llm.generate(prompts, params, priority=[BATCH, BATCH])
