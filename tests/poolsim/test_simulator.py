"""The simulated pool stepped through small traces whose outcome is known exactly."""
from __future__ import annotations

from dataclasses import replace

import pytest

from pool.autoscaler import ScalingConfig
from poolsim.cluster import ClusterShape
from poolsim.policies import StaticPolicy, always_warm, knative, thawpool
from poolsim.replica_model import ColdStarts, GpuKind, Throughput, Transfer, from_json, to_json
from poolsim.simulator import SimSettings, Simulation, simulate
from poolsim.workload import Deployment, ModelShape, Request, Trace

GIB = 1024 ** 3
# round figures: 1 GB of weights takes 1 + 1 s from S3, then 2 + 1 s to load fresh,
# 0.5 + 1 s into a standby, 0.1 + 0.1 s to wake and as long to fall asleep
KIND = GpuKind("test", memory_gb=80, price_per_hour=2.0, gpus_per_node=2,
               cold_starts=ColdStarts(s3=Transfer(1.0, 1.0), cache=Transfer(2.0, 1.0), standby=Transfer(0.5, 1.0),
                                      wake=Transfer(0.1, 10.0), sleep=Transfer(0.1, 10.0), standby_refill_s=5.0),
               throughput=Throughput(hbm_gbps=1000.0, per_seq_s=0.0, prefill_tflops=1000.0))
SMALL = ModelShape("small", parameters_b=0.5, weight_bytes=10 ** 9)
STEP = 1e-3                                     # 1 GB over 1000 GB/s
PREFILL_100 = 100 * 2 * 0.5e9 / 1e15            # 100 tokens of a 0.5B model at 1000 TFLOPS
EXACT = pytest.approx
ONE = (Deployment("a", "t1", SMALL),)


def trace(requests, deployments=ONE, duration_s=4000.0):
    reqs = sorted(requests, key=lambda r: r.at_s)
    return Trace(tuple(deployments), duration_s, lambda: iter(reqs))


def req(at, dep="a", prompt=100, output=1):
    return Request(at, dep, prompt, output)


def fixed(idle_s=60.0, **kw):
    return StaticPolicy("fixed", ScalingConfig(max_replicas=4, target_concurrency=8, idle_timeout_s=idle_s,
                                               scale_down_delay_s=10.0), **kw)


def run(tr, pol, nodes=1, **settings):
    settings.setdefault("warm_caches", False)
    return simulate(tr, ClusterShape(nodes, KIND), pol, SimSettings(**settings))


def ttfts(tr, pol, nodes=1, **settings):
    """Each answered request's time to first token, in the order they were answered."""
    settings.setdefault("warm_caches", False)
    sim = Simulation(tr, ClusterShape(nodes, KIND), pol, SimSettings(**settings))
    sim.run()
    return list(sim.tally.ttft)


def test_first_request_waits_for_a_cold_start_from_s3():
    out = run(trace([req(10.0)]), fixed(node_cache=False))
    assert out.cold_starts == {"wake": 0, "standby": 0, "cache": 0, "s3": 1}
    assert out.ttft_p50_s == EXACT(2.0 + 3.0 + PREFILL_100 + STEP)
    assert out.served_by_tier["s3"] == 1


def test_a_request_while_the_replica_is_up_is_warm():
    out = run(trace([req(10.0), req(20.0)]), fixed())
    assert out.served_by_tier == {"warm": 1, "wake": 0, "standby": 0, "cache": 0, "s3": 1}
    assert ttfts(trace([req(10.0), req(20.0)]), fixed())[1] == EXACT(PREFILL_100 + STEP)


def test_gpu_time_runs_from_placement_to_the_idle_stop_on_a_tick():
    out = run(trace([req(10.0)]), fixed(idle_s=60.0))
    done = 10.0 + 5.0 + PREFILL_100 + STEP          # the request's last token
    stop = -(-(done + 60.0) // 0.5) * 0.5            # the first tick past the idle timeout
    assert out.gpu_seconds == EXACT(stop - 10.0)
    assert out.busy_gpu_seconds == EXACT(PREFILL_100 + STEP)


def test_without_a_node_cache_every_cold_start_downloads_again():
    reqs = [req(10.0), req(500.0)]
    assert run(trace(reqs), fixed(node_cache=False)).cold_starts["s3"] == 2
    cached = run(trace(reqs), fixed(node_cache=True))
    assert (cached.cold_starts["s3"], cached.cold_starts["cache"]) == (1, 1)
    assert ttfts(trace(reqs), fixed(node_cache=True))[1] == EXACT(3.0 + PREFILL_100 + STEP)


def test_a_standby_saves_the_fresh_process_and_is_refilled():
    out = run(trace([req(10.0), req(500.0)]), fixed(standbys_per_node=1))
    assert out.cold_starts == {"wake": 0, "standby": 1, "cache": 0, "s3": 1}   # by where the weights came from
    # s3 + a standby's load for the first (one waits at the start); the second gets the refill
    first, second = ttfts(trace([req(10.0), req(500.0)]), fixed(standbys_per_node=1))
    assert (first, second) == (EXACT(2.0 + 1.5 + PREFILL_100 + STEP), EXACT(1.5 + PREFILL_100 + STEP))


def test_the_sleep_tier_wakes_instead_of_a_cold_start():
    pol = StaticPolicy("sleepy", ScalingConfig(max_replicas=4, idle_timeout_s=60.0, sleep_timeout_s=1000.0))
    out = run(trace([req(10.0), req(500.0)]), pol)
    assert out.cold_starts == {"wake": 1, "standby": 0, "cache": 0, "s3": 1}
    assert ttfts(trace([req(10.0), req(500.0)]), pol)[1] == EXACT(0.2 + PREFILL_100 + STEP)
    # asleep from (idle tick + 0.2 s falling asleep) until the wake: no GPU time then
    first_stop = -(-(10.0 + 5.0 + PREFILL_100 + STEP + 60.0) // 0.5) * 0.5 + 0.2
    second_stop = -(-(500.0 + 0.2 + PREFILL_100 + STEP + 60.0) // 0.5) * 0.5 + 0.2
    assert out.gpu_seconds == EXACT((first_stop - 10.0) + (second_stop - 500.0))


def test_a_sleeper_past_its_timeout_stops_and_the_next_start_is_cold():
    pol = StaticPolicy("sleepy", ScalingConfig(max_replicas=4, idle_timeout_s=60.0, sleep_timeout_s=100.0))
    out = run(trace([req(10.0), req(1000.0)]), pol)
    assert out.cold_starts == {"wake": 0, "standby": 0, "cache": 1, "s3": 1}


def test_full_pool_makes_a_replica_wait_for_slots_then_serves_it():
    big = ModelShape("big", parameters_b=30, weight_bytes=70 * GIB)     # one a GPU: 2 GPUs on one node
    deps = tuple(Deployment(n, f"t-{n}", big) for n in "abc")
    tr = trace([req(10.0, "a"), req(10.0, "b"), req(11.0, "c")], deps)
    out = run(tr, fixed(idle_s=30.0), kv_cache_tokens=0)
    assert out.answered == 3 and out.peak_gpus == 2
    # c waits until a or b is stopped for idleness, then starts from S3
    assert max(ttfts(tr, fixed(idle_s=30.0), kv_cache_tokens=0)) > 30.0 + 150.0


def test_always_warm_starts_every_deployment_at_once_and_holds_it():
    deps = (Deployment("a", "t1", SMALL), Deployment("b", "t2", SMALL))
    out = run(trace([req(100.0, "a")], deps, duration_s=1000.0), always_warm())
    assert out.cold_starts["s3"] == 2
    assert out.served_by_tier["warm"] == 1
    assert out.gpu_seconds == EXACT(2 * 1000.0)


def test_a_full_queue_refuses_and_a_long_wait_times_out():
    big = ModelShape("big", parameters_b=30, weight_bytes=70 * GIB)
    deps = tuple(Deployment(n, "t", big) for n in "abc")
    reqs = [req(1.0, "a", output=10 ** 7), req(1.0, "b", output=10 ** 7)] + [req(2.0, "c")] * 3
    out = run(trace(reqs, deps), fixed(), kv_cache_tokens=0, queue_limit=2, wait_timeout_s=300.0)
    assert out.rejected == 1 and out.timed_out == 2


def test_the_same_trace_gives_the_same_outcome():
    reqs = [req(float(t), "a", prompt=50 + t % 7, output=1 + t % 5) for t in range(0, 3000, 13)]
    first, second = (run(trace(reqs), thawpool()) for _ in range(2))
    assert first.ttft_p99_s == second.ttft_p99_s and first.gpu_seconds == second.gpu_seconds


def test_knative_holds_less_gpu_time_than_always_warm_on_sporadic_traffic():
    reqs = [req(float(t)) for t in range(0, 20000, 2000)]
    warm = run(trace(reqs, duration_s=20000.0), always_warm())
    scaled = run(trace(reqs, duration_s=20000.0), knative())
    assert scaled.gpu_seconds < warm.gpu_seconds / 5
    assert scaled.ttft_p50_s > warm.ttft_p50_s


def test_a_simulation_runs_once():
    sim = Simulation(trace([req(1.0)]), ClusterShape(1, KIND), fixed())
    sim.run()
    assert sim.loop.now == 4000.0


def test_warm_caches_make_the_first_start_a_cache_load():
    deps = tuple(Deployment(n, "t", SMALL) for n in "abc")
    tr = trace([req(10.0, "a"), req(10.0, "b"), req(10.0, "c")], deps)
    out = run(tr, fixed(), nodes=2, warm_caches=True)
    assert out.cold_starts["s3"] == 0 and out.cold_starts["cache"] == 3
    # without a node cache there is nothing to warm: every start downloads
    assert run(tr, fixed(node_cache=False), nodes=2, warm_caches=True).cold_starts["s3"] == 3


def test_per_deployment_stats_count_requests_starts_and_gpu_time():
    out = run(trace([req(10.0), req(500.0)]), fixed(idle_s=60.0))
    stats = out.deployments["a"]
    assert (stats.requests, stats.cold_starts, stats.peak_replicas) == (2, 2, 1)
    assert stats.gpu_seconds == EXACT(out.gpu_seconds)


def test_a_learned_window_pulls_evicted_weights_back_before_it_opens():
    """One model's worth of node cache; b's starts evict a's weights between a's calls ten
    minutes apart. Once a's window is learned, its weights come back ahead of it
    (pool.weights.prefetch.predicted_due) and the pre-warmed start loads from the cache."""
    deps = (Deployment("a", "t1", SMALL), Deployment("b", "t2", SMALL))
    reqs = [req(600.0 * i, "a") for i in range(16)] + [req(600.0 * i + 300.0, "b") for i in range(16)]
    tr = trace(reqs, deps, duration_s=10_000.0)
    learned = replace(fixed(idle_s=60.0), learned_keep_alive=True)

    def outcome(lead_s):
        sim = Simulation(tr, ClusterShape(1, KIND, node_cache_gb=1.0), learned,
                         SimSettings(warm_caches=False, prefetch_lead_s=lead_s))
        return sim.run(), list(sim.tally.ttft)

    ahead, ttft = outcome(60.0)
    late, _ = outcome(-10_000.0)                # never due: no prefetch
    assert ahead.prefetches >= 3 and late.prefetches == 0
    assert ahead.cold_starts["s3"] < late.cold_starts["s3"]
    assert ttft[-2] == EXACT(PREFILL_100 + STEP)   # a's last call found its pre-warmed replica


def test_replicas_sharing_a_gpu_occupy_it_once_and_exclusive_ones_take_a_gpu_each():
    deps = (Deployment("a", "t1", SMALL), Deployment("b", "t2", SMALL))
    tr = trace([req(10.0, "a"), req(10.0, "b")], deps, duration_s=1000.0)
    shared = run(tr, always_warm_like(exclusive=False))
    assert shared.gpu_seconds == EXACT(2 * 1000.0) and shared.occupied_gpu_seconds == EXACT(1000.0)
    own = run(tr, always_warm_like(exclusive=True))
    assert own.occupied_gpu_seconds == EXACT(2 * 1000.0) and own.peak_gpus == 2


def always_warm_like(exclusive):
    return StaticPolicy("warm", ScalingConfig(min_replicas=1, max_replicas=1), exclusive_gpus=exclusive)


def test_slo_attainment_counts_answers_within_the_target_of_all_requests():
    # a cold start from S3 takes 5 s (over the 2 s target of a small model), the next is warm
    out = run(trace([req(10.0), req(20.0)]), fixed())
    assert out.within_slo == 1 and out.slo_attainment == 0.5
    assert out.cold_share == 0.5 and 0.0 < out.idle_share < 1.0

def cpu_kind(node_cores, overhead_s=0.0, stream_s=0.0):
    tp = Throughput(hbm_gbps=1000.0, per_seq_s=0.0, prefill_tflops=1000.0, node_cores=node_cores,
                    request_overhead_s=overhead_s, stream_s=stream_s)
    return GpuKind("cpu", memory_gb=80, price_per_hour=0.0, gpus_per_node=2, cold_starts=KIND.cold_starts,
                   throughput=tp)


def first_tokens(kind):
    """Two deployments' replicas, ready at the same moment, each given one request then."""
    deps = (Deployment("a", "t1", SMALL), Deployment("b", "t1", SMALL))
    sim = Simulation(trace([req(10.0, "a"), req(10.0, "b")], deps), ClusterShape(1, kind), fixed(),
                     SimSettings(warm_caches=False))
    sim.run()
    return [t - 5.0 for t in sim.tally.ttft]           # less the cold start from S3


def test_replicas_packed_on_one_gpu_take_turns():
    assert first_tokens(KIND) == [EXACT(PREFILL_100 + STEP), EXACT(2 * (PREFILL_100 + STEP))]


def test_cpu_slots_share_the_node_cores_not_the_slot():
    assert first_tokens(cpu_kind(node_cores=2)) == [EXACT(PREFILL_100 + STEP)] * 2
    assert first_tokens(cpu_kind(node_cores=1)) == [EXACT(PREFILL_100 + STEP), EXACT(2 * (PREFILL_100 + STEP))]


def test_the_request_overhead_comes_before_every_first_token():
    assert first_tokens(cpu_kind(node_cores=2, overhead_s=0.03)) == [EXACT(0.03 + PREFILL_100 + STEP)] * 2


def test_each_other_request_in_flight_on_the_node_delays_a_first_token_by_stream_s():
    # the second begins while the first runs on the node's other replica
    assert first_tokens(cpu_kind(node_cores=2, stream_s=0.004)) == \
        [EXACT(PREFILL_100 + STEP), EXACT(0.004 + PREFILL_100 + STEP)]


def test_a_request_done_no_longer_delays_the_next():
    kind = cpu_kind(node_cores=2, stream_s=0.004)
    sim = Simulation(trace([req(10.0), req(20.0)]), ClusterShape(1, kind), fixed(), SimSettings(warm_caches=False))
    sim.run()
    assert list(sim.tally.ttft) == [EXACT(5.0 + PREFILL_100 + STEP), EXACT(PREFILL_100 + STEP)]


def test_a_kind_round_trips_through_json_with_its_cpu_fields():
    kind = cpu_kind(node_cores=2, overhead_s=0.03, stream_s=0.004)
    assert from_json(to_json(kind)) == kind


def queued_ttfts(requests, budget):
    """TTFTs less the 5 s cold start, on a kind whose prompts queue for prefill steps."""
    tp = Throughput(hbm_gbps=1000.0, per_seq_s=0.0, prefill_tflops=1000.0, prefill_step_tokens=budget)
    kind = GpuKind("queued", memory_gb=80, price_per_hour=0.0, gpus_per_node=2, cold_starts=KIND.cold_starts,
                   throughput=tp)
    sim = Simulation(trace(requests), ClusterShape(1, kind), fixed(), SimSettings(warm_caches=False))
    sim.run()
    return [t - 5.0 for t in sim.tally.ttft]


def test_prompts_that_wait_for_a_prefill_step_are_prefilled_together_in_the_next():
    first = PREFILL_100 + STEP                           # alone in the first step, after the cold start
    together = first + 2 * PREFILL_100 + STEP            # the other two, in one step after it
    assert queued_ttfts([req(10.0)] * 3, budget=2048) == [EXACT(first), EXACT(together), EXACT(together)]


def test_a_prompt_past_the_step_budget_is_finished_in_the_next_step():
    first = PREFILL_100 + STEP
    second = first + 1.5 * PREFILL_100 + STEP            # the second whole and half the third
    third = second + 0.5 * PREFILL_100 + STEP
    assert queued_ttfts([req(10.0)] * 3, budget=150) == [EXACT(first), EXACT(second), EXACT(third)]


def test_without_a_step_budget_each_prompt_is_prefilled_apart():
    assert ttfts(trace([req(10.0)] * 3), fixed()) == [EXACT(5.0 + PREFILL_100 + STEP)] * 3


def test_the_gateway_works_one_request_at_a_time():
    tp = Throughput(hbm_gbps=1000.0, per_seq_s=0.0, prefill_tflops=1000.0, request_overhead_s=0.01,
                    gateway_s=0.02, prefill_step_tokens=2048)
    kind = GpuKind("gw", memory_gb=80, price_per_hour=0.0, gpus_per_node=2, cold_starts=KIND.cold_starts,
                   throughput=tp)
    reqs = [req(10.0), req(10.0), req(30.0)]
    sim = Simulation(trace(reqs), ClusterShape(1, kind), fixed(), SimSettings(warm_caches=False))
    sim.run()
    alone = 0.02 + 0.01 + PREFILL_100 + STEP
    # the two of the cold start pass the gateway in turn, each then prefilled in its own step;
    # the third comes when the gateway is idle again
    assert list(sim.tally.ttft) == [EXACT(5.0 + alone), EXACT(5.0 + alone + 0.02), EXACT(alone)]
