"""benchmarks/pool_economics: each policy's figures as ratios to a peer's."""
from benchmarks.pool_economics import ratio, ratio_rows
from poolsim.outcome import Outcome


def outcome(policy: str, gpu_s: float, busy_s: float, warm_served: int, p50: float, p99: float,
            within: int) -> Outcome:
    return Outcome(policy=policy, duration_s=3600.0, gpus=8, price_per_gpu_hour=1.0, requests=100, answered=100,
                   timed_out=0, rejected=0, ttft_p50_s=p50, ttft_p99_s=p99, ttft_by_class={}, cold_starts={},
                   served_by_tier={"warm": warm_served}, gpu_seconds=gpu_s, busy_gpu_seconds=busy_s, peak_gpus=1,
                   output_tokens=0, events=0, wall_s=0.0, occupied_gpu_seconds=gpu_s, within_slo=within)


def test_a_ratio_to_zero_is_a_difference_in_points():
    assert ratio(0.5, 0.25) == "2.000x"
    assert ratio(0.0125, 0.0) == "+1.25pt"


def test_every_other_policy_gets_a_row_of_ratios_to_the_peer():
    warm = outcome("always-warm", gpu_s=1000.0, busy_s=100.0, warm_served=100, p50=0.02, p99=0.2, within=100)
    ours = outcome("thawpool", gpu_s=250.0, busy_s=100.0, warm_served=98, p50=0.04, p99=0.5, within=99)
    head, row = ratio_rows({"always-warm": warm, "thawpool": ours}, warm)
    assert head.split()[:3] == ["vs", "always-warm", "occupied"]
    # occupied, held, idle (0.6 vs 0.9), cold (+2 points), p50, p99, SLO
    assert row.split() == ["thawpool", "0.250x", "0.250x", "0.667x", "+2.00pt", "2.000x", "2.500x", "0.990x"]
