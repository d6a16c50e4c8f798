"""The capacity planner and the textbook estimate beside it, over small traces."""
from __future__ import annotations

import json

import pytest

from controlplane.cli.main import main
from controlplane.cli.plan import parse_slo
from poolsim.planner import Slo, meets, plan, recommend
from poolsim.simulator import SimSettings, simulate
from poolsim.cluster import ClusterShape
from poolsim.textbook import estimate
from poolsim.workload import Deployment, ModelShape
from tests.poolsim.test_simulator import KIND, SMALL, fixed, req, trace

GIB = 1024 ** 3
BIG = ModelShape("big", parameters_b=30, weight_bytes=70 * GIB)      # one a GPU
COLD = SimSettings(warm_caches=False, kv_cache_tokens=0)


def busy_trace():
    """Four deployments of one-GPU models, each busy for a long time from t=10: a node of
    two GPUs can hold two of them, so one node leaves two waiting past the client's patience."""
    deps = tuple(Deployment(n, f"t-{n}", BIG) for n in "abcd")
    reqs = [req(10.0 + i, n, output=20_000) for i, n in enumerate("abcd")]
    return trace(reqs, deps, duration_s=3000.0)


def test_textbook_counts_gpu_seconds_per_minute_at_batch_b():
    tr = trace([req(float(t), prompt=100, output=11) for t in range(0, 60, 2)], duration_s=120.0)
    est = estimate(tr, KIND, batch=4, headroom=0.3)
    tp = KIND.throughput
    per_request = (tp.prefill_s(0.5e9, 1, 100) + 11 * tp.step_s(10 ** 9, 1, 4)) / 4
    assert est.peak_gpus == pytest.approx(30 * per_request / 60.0)
    assert est.mean_gpus == pytest.approx(30 * per_request / 120.0)
    assert est.nodes == 1 and est.gpus == pytest.approx(est.peak_gpus * 1.3)


def test_meets_checks_every_class_and_the_lost_share():
    out = simulate(trace([req(10.0)]), ClusterShape(1, KIND), fixed(), COLD)
    p99 = out.ttft_by_class["small (<4B)"][1]
    assert meets(out, Slo({"small (<4B)": p99 + 0.01}))
    assert not meets(out, Slo({"small (<4B)": p99 - 0.01}))


def test_the_smallest_pool_that_keeps_everyone_answered_wins():
    slo = Slo({"large (>20B)": 1000.0}, max_lost=0.0)
    result = plan(busy_trace(), [KIND], [fixed()], slo, max_nodes=8, settings=COLD)
    assert result.best is not None and result.best.nodes == 2
    assert {t.nodes: t.meets for t in result.tried}[1] is False
    assert result.fleet_cost == pytest.approx(2 * 2 * 3000.0 / 3600.0 * KIND.price_per_hour)


def test_no_pool_meets_an_slo_below_any_cold_start():
    result = plan(busy_trace(), [KIND], [fixed()], Slo({"large (>20B)": 0.5}), max_nodes=4, settings=COLD)
    # from the textbook's 3 nodes (the four long requests in one minute) up to the most allowed
    assert result.textbook["test"].nodes == 3
    assert result.best is None and [t.nodes for t in result.tried] == [3, 4]


def test_a_model_no_node_can_hold_rules_its_gpu_kind_out():
    result = plan(busy_trace(), [KIND], [fixed()], Slo({}), settings=SimSettings(kv_cache_tokens=10 ** 6))
    assert result.best is None and result.tried == ()
    assert "deployment a (big) never fits this pool" in result.unfit["test"]


def test_recommendations_follow_what_each_deployment_did():
    deps = (Deployment("steady", "t", SMALL), Deployment("rare", "t", SMALL))
    reqs = [req(float(t), "steady") for t in range(0, 4000, 5)] + [req(100.0, "rare")]
    tr = trace(reqs, deps)
    out = simulate(tr, ClusterShape(1, KIND), fixed(idle_s=60.0), COLD)
    recs = {r.deployment: r for r in recommend(out, fixed(idle_s=60.0), tr)}
    assert recs["steady"].min_replicas == 1 and recs["rare"].min_replicas == 0
    assert recs["steady"].max_replicas == 2 and recs["steady"].idle_timeout_s == 60.0


def test_slo_flags_are_checked():
    assert parse_slo("small=1.5,large=9", 0.01).ttft_p99_s == {"small (<4B)": 1.5, "large (>20B)": 9.0}
    for bad in ("tiny=1", "small=x", "small=0"):
        with pytest.raises(ValueError):
            parse_slo(bad, 0.0)


def test_thawpool_plan_prints_a_plan_as_json(capsys):
    code = main(["plan", "--synthetic", "--hours", "0.1", "--count", "20", "--gpus", "h100",
                 "--policies", "thawpool-60s", "--slo", "small=60,medium=60,large=300", "--max-nodes", "4",
                 "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["best"]["kind"] == "h100" and result["best"]["meets"]
    assert len(result["recommendations"]) == 20 and result["textbook"]["h100"]["nodes"] >= 1


def test_thawpool_plan_refuses_bad_flags_with_status_2(capsys):
    assert main(["plan", "--synthetic", "--slo", "huge=1"]) == 2
    assert "not a size class" in capsys.readouterr().err
    assert main(["plan", "--requests", "x.jsonl"]) == 2
    assert "--deployments" in capsys.readouterr().err
    assert main(["plan", "--synthetic", "--gpus", "tpu"]) == 2
    assert "no parameters for GPU kind" in capsys.readouterr().err
