"""The calibration's fits recover the parameters that made exact synthetic timings."""
from __future__ import annotations

import pytest

from poolsim.calibrate import Line, Machine, Timings, cold_starts_s, fit_line, fit_stream_s, kind
from poolsim.replica_model import from_json, to_json

EXACT = pytest.approx
MB = 10 ** 6
WEIGHTS, PARAMETERS = 20 * MB, 5e6
BASE, PER_SEQ = 0.002, 0.0001           # step(b) = 2 ms + b * 0.1 ms
OVERHEAD, PER_TOKEN = 0.030, 0.0001     # warm TTFT(p) = 30 ms + p * 0.1 ms + step(1)
GATEWAY = 0.008                         # of the 30 ms, the gateway's work: bursts queue for it
MACHINE = Machine("cpu-test", slots=4, slot_memory_gb=2.0, cores=2, prefill_step_tokens=2048)


def warm(p):
    return OVERHEAD + p * PER_TOKEN + BASE + PER_SEQ


def timings(**changes):
    """Exact figures, with a stray repeat in each that the medians must drop."""
    base = dict(
        weight_bytes=WEIGHTS, parameters=PARAMETERS,
        step_s={b: [BASE + b * PER_SEQ] * 2 + [9.0] for b in (1, 2, 4, 8)},
        warm_ttft_s={p: [warm(p)] * 2 + [0.0] for p in (8, 64, 256)},
        burst_last_ttft_s={k: [warm(8) + (k - 1) * (GATEWAY + 8 * PER_TOKEN)] * 3 for k in (1, 2, 4, 8)},
        burst_prompt_tokens=8,
        cold_ttft_s={"standby": [warm(32) + 0.2] * 2 + [5.0], "cache": [warm(32) + 4.0] * 3,
                     "s3": [warm(32) + 0.2 + 0.5] * 3},
        cold_prompt_tokens=32, s3_gbps=0.1, read_gbps=1.0, refill_delay_s=1.0)
    return Timings(**{**base, **changes})


def test_a_line_through_exact_points():
    assert fit_line([(1, 3.0), (2, 5.0), (4, 9.0)]) == Line(EXACT(1.0), EXACT(2.0))


def test_a_line_needs_two_distinct_x():
    with pytest.raises(ValueError):
        fit_line([(2, 1.0), (2, 3.0)])


def test_decode_and_prefill_are_recovered():
    tp = kind(timings(), MACHINE).throughput
    assert tp.step_s(WEIGHTS, 1, 4) == EXACT(BASE + 4 * PER_SEQ)
    assert tp.per_seq_s == EXACT(PER_SEQ)
    assert tp.prefill_s(PARAMETERS, 1, 100) == EXACT(100 * PER_TOKEN)
    assert tp.gateway_s == EXACT(GATEWAY)
    assert tp.request_overhead_s == EXACT(OVERHEAD - GATEWAY)
    assert (tp.node_cores, tp.prefill_step_tokens) == (2, 2048)


def test_cold_starts_are_the_cold_ttft_less_the_warm_one():
    t = timings()
    line = Line(warm(0), PER_TOKEN)
    assert cold_starts_s(t, line) == {"standby": EXACT(0.2), "cache": EXACT(4.0), "s3": EXACT(0.5)}


def test_each_transfer_is_its_bulk_rate_and_the_rest_fixed():
    starts = kind(timings(), MACHINE).cold_starts
    assert starts.s3.gbps == 0.1 and starts.s3.seconds(WEIGHTS) == EXACT(0.5)
    assert starts.standby.seconds(WEIGHTS) == EXACT(0.2)
    assert starts.cache.fixed_s == EXACT(4.0 - 0.02)
    assert starts.standby_refill_s == EXACT(0.2 + 1.0 + 4.0)


def test_noise_never_makes_a_fixed_part_or_prefill_negative():
    t = timings(cold_ttft_s={"standby": [0.0], "cache": [0.0], "s3": [0.0]},
                warm_ttft_s={8: [0.05], 64: [0.04]})
    k = kind(t, MACHINE)
    assert k.cold_starts.standby.fixed_s == 0.0 and k.cold_starts.s3.fixed_s == 0.0
    assert k.throughput.prefill_tflops > 0 and k.throughput.request_overhead_s >= 0


def test_the_kind_is_laid_out_as_the_machine_and_round_trips():
    k = kind(timings(), MACHINE)
    assert (k.name, k.gpus_per_node, k.memory_gb) == ("cpu-test", 4, 2.0)
    assert from_json(to_json(k)) == k


def test_stream_s_is_the_grid_point_whose_simulated_p50_is_nearest_the_real_one():
    def simulated(stream_s: float) -> float:          # p50 grows with the contention
        return 0.020 + 3.0 * stream_s

    assert fit_stream_s(simulated, real_p50=0.032) == pytest.approx(0.004)
    assert fit_stream_s(simulated, real_p50=0.010) == 0.0                  # below every point: the least
    assert fit_stream_s(simulated, real_p50=0.5) == pytest.approx(0.008)   # above: the most


def test_a_replay_that_answered_nothing_fits_nothing():
    with pytest.raises(ValueError, match="answered nothing"):
        fit_stream_s(lambda s: 0.02, real_p50=0.0)
