"""Per-deployment rates and burstiness meet the Azure Functions figures (Shahrad et al., ATC'20)."""
import numpy as np
import pytest

from poolsim.popularity import (CV_LN_SIGMA, CV_MEDIAN, RATE_LOG10_MU, RATE_LOG10_SIGMA, burst_cvs,
                                daily_rates, rates_per_s)


def test_fit_passes_through_the_published_points():
    assert RATE_LOG10_MU == pytest.approx(1.603, abs=0.001)
    assert RATE_LOG10_SIGMA == pytest.approx(1.772, abs=0.001)


@pytest.mark.parametrize("n", [200, 1000, 5000])
def test_fractions_invoked_at_most_hourly_and_at_most_every_minute(n):
    daily = daily_rates(n)
    assert np.mean(daily <= 24) == pytest.approx(0.45, abs=0.01)
    assert np.mean(daily <= 1440) == pytest.approx(0.81, abs=0.01)


def test_rates_span_eight_orders_of_magnitude_and_are_ascending():
    daily = daily_rates(200)
    assert np.all(np.diff(daily) > 0)
    assert np.log10(daily[-1] / daily[0]) > 8


def test_rates_per_s_shuffle_and_scale_the_same_population():
    rng = np.random.default_rng(5)
    rates = rates_per_s(rng, 200, scale=0.5)
    assert sorted(rates) == pytest.approx(daily_rates(200) / 86_400 * 0.5)
    assert not np.all(np.diff(rates) > 0)


def test_cvs_meet_the_no_timer_cdf_before_clipping():
    cvs = burst_cvs(np.random.default_rng(6), 100_000, (1e-3, 1e3))
    for cv, published in ((1, 0.35), (2, 0.55), (4, 0.76), (8, 0.90)):
        assert np.mean(cvs <= cv) == pytest.approx(published, abs=0.025)
    assert np.median(cvs) == pytest.approx(CV_MEDIAN, rel=0.02)
    assert np.std(np.log(cvs)) == pytest.approx(CV_LN_SIGMA, rel=0.02)


def test_cvs_are_clipped_to_the_range():
    cvs = burst_cvs(np.random.default_rng(7), 10_000, (1.0, 4.0))
    assert cvs.min() == 1.0 and cvs.max() == 4.0
    assert np.mean(cvs == 1.0) == pytest.approx(0.33, abs=0.02)     # the draws at CV <= 1, raised to 1
