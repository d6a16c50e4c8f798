"""generate(config): the plan's mix, and a stream that is lazy, ordered, repeatable and Azure-shaped."""
import dataclasses
import itertools
import types

import numpy as np
import pytest

from poolsim.arrivals import Diurnal
from poolsim.catalogue import CATALOGUE, size_mix
from poolsim.traffic import TrafficConfig, generate, plan

# about 120,000 requests a day: 2% of the default population's traffic
SMALL = TrafficConfig(rate_scale=0.02, seed=3)


@pytest.fixture(scope="module")
def small_requests():
    trace = generate(SMALL)
    return trace, list(trace.requests())


def test_requests_is_a_lazy_stream_and_the_same_each_call():
    trace = generate(SMALL)
    stream = trace.requests()
    assert isinstance(stream, types.GeneratorType)
    assert list(itertools.islice(stream, 1000)) == list(itertools.islice(trace.requests(), 1000))
    assert list(itertools.islice(generate(SMALL).requests(), 1000)) == list(itertools.islice(trace.requests(), 1000))
    other = generate(dataclasses.replace(SMALL, seed=4))
    assert list(itertools.islice(other.requests(), 100)) != list(itertools.islice(trace.requests(), 100))


def test_whole_stream_is_in_time_order_within_the_day_and_names_known_deployments(small_requests):
    trace, requests = small_requests
    times = np.array([r.at_s for r in requests])
    assert np.all(np.diff(times) >= 0)
    assert times[0] >= 0 and times[-1] < trace.duration_s
    assert {r.deployment for r in requests} <= {d.name for d in trace.deployments}
    expected = sum(d.mean_rate_per_s for d in trace.deployments) * trace.duration_s
    assert len(requests) == pytest.approx(expected, rel=0.1)


def test_busy_deployments_get_their_mean_rate(small_requests):
    trace, requests = small_requests
    counts: dict[str, int] = {}
    for r in requests:
        counts[r.deployment] = counts.get(r.deployment, 0) + 1
    busy = [d for d in trace.deployments if d.mean_rate_per_s * trace.duration_s > 5000]
    assert len(busy) >= 3
    for d in busy:
        assert counts[d.name] == pytest.approx(d.mean_rate_per_s * trace.duration_s, rel=0.15), d


def test_lengths_follow_each_deployment_kind(small_requests):
    trace, requests = small_requests
    kinds = {d.name: d.kind for d in trace.deployments}
    for kind, prompt_median, output_median in (("code", 1469, 13), ("chat", 1020, 129)):
        mine = [r for r in requests if kinds[r.deployment] == kind]
        assert len(mine) > 5000
        assert np.median([r.prompt_tokens for r in mine]) == pytest.approx(prompt_median, rel=0.05)
        assert np.median([r.output_tokens for r in mine]) == pytest.approx(output_median, rel=0.08)


def test_peak_to_trough_of_the_whole_day():
    trace = generate(TrafficConfig(rate_scale=0.02, seed=5, diurnal=Diurnal(amplitude=0.2, peak_hour=14.0),
                                   cv_range=(1.0, 1.0)))
    hourly = np.bincount([int(r.at_s // 3600) for r in trace.requests()], minlength=24)
    assert hourly[14] / hourly[2] == pytest.approx(1.5, rel=0.06)


def test_inter_arrival_cv_is_above_one_where_configured():
    def busiest_cv(cv_range):
        config = TrafficConfig(deployments=50, rate_scale=0.05, seed=8, diurnal=Diurnal(0.0), cv_range=cv_range)
        trace = generate(config)
        top = max(trace.deployments, key=lambda d: d.mean_rate_per_s).name
        gaps = np.diff([r.at_s for r in trace.requests() if r.deployment == top])
        return np.std(gaps) / np.mean(gaps)
    assert busiest_cv((3.0, 3.0)) == pytest.approx(3.0, rel=0.1)
    assert busiest_cv((1.0, 1.0)) == pytest.approx(1.0, rel=0.05)


def test_plan_meets_the_published_rate_fractions():
    deployments = [p.deployment for p in plan(TrafficConfig(deployments=1000))]
    per_day = np.array([d.mean_rate_per_s * 86_400 for d in deployments])
    assert np.mean(per_day <= 24) == pytest.approx(0.45, abs=0.01)
    assert np.mean(per_day <= 1440) == pytest.approx(0.81, abs=0.01)
    assert all(1.0 <= p.cv <= 4.0 for p in plan(TrafficConfig(deployments=1000)))


def test_plan_mixes_models_kinds_and_tenants_as_configured():
    planned = plan(TrafficConfig(deployments=20_000, tenants=100, code_fraction=0.3))
    names = [p.deployment.model.name for p in planned]
    for entry, share in zip(CATALOGUE, size_mix(CATALOGUE, 0.5)):
        assert names.count(entry.name) / len(names) == pytest.approx(share, abs=0.012), entry
    assert np.mean([p.deployment.kind == "code" for p in planned]) == pytest.approx(0.3, abs=0.015)
    gpus = {p.deployment.model.name: p.deployment.model.gpu_count for p in planned}
    assert gpus["llama-3-70b"] == 4 and gpus["codellama-34b"] == 2 and gpus["llama-3-8b"] == 1
    owners = [p.deployment.tenant for p in planned]
    assert owners.count("tenant0000") / owners.count("tenant0009") == pytest.approx(10, rel=0.3)   # Zipf
    assert len({p.deployment.name for p in planned}) == 20_000


def test_gpu_memory_sets_tensor_parallelism():
    planned = plan(TrafficConfig(deployments=2000, gpu_memory_bytes=141 * 10 ** 9))
    assert {p.deployment.model.gpu_count for p in planned if p.deployment.model.parameters_b == 70} == {2}


@pytest.mark.parametrize("fields", [dict(deployments=0), dict(duration_s=0), dict(rate_scale=-1),
                                    dict(diurnal=Diurnal(amplitude=1.0)), dict(cv_range=(2.0, 1.0)),
                                    dict(code_fraction=1.5), dict(seed=-1), dict(catalogue=())])
def test_config_refuses_values_that_make_no_traffic(fields):
    with pytest.raises(ValueError):
        TrafficConfig(**fields)


def test_arrivals_drawn_again_keep_the_deployments_and_change_the_requests():
    config = TrafficConfig(deployments=6, tenants=2, duration_s=600.0, seed=3, rate_scale=12.0)
    main, apart = generate(config), generate(config, arrivals_seed=1003)
    assert apart.deployments == main.deployments
    first, second = list(main.requests()), list(apart.requests())
    assert first != second
    assert {r.deployment for r in second} <= {d.name for d in main.deployments}
    # the same rates: the busiest deployment of one is the busiest of the other
    def busiest(requests):
        counts = {}
        for r in requests:
            counts[r.deployment] = counts.get(r.deployment, 0) + 1
        return max(counts, key=counts.get)
    assert busiest(first) == busiest(second)
    assert list(generate(config, arrivals_seed=1003).requests()) == second
