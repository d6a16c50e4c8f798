"""The arrival process: diurnal clock, Gamma gaps with a set CV, stationary start."""
import numpy as np
import pytest

from poolsim.arrivals import Diurnal, arrival_times, inverse_cumulative

DAY = 86_400.0
FLAT = Diurnal(amplitude=0.0)


def times(rate, cv, diurnal=FLAT, duration=DAY, seed=0):
    return np.concatenate([np.zeros(0), *arrival_times(np.random.default_rng(seed), rate, cv, diurnal, duration)])


def test_cumulative_is_the_integral_of_the_multiplier():
    diurnal = Diurnal(amplitude=0.3, peak_hour=9.0)
    t = np.linspace(0, 2 * DAY, 20_001)
    steps = diurnal.multiplier(t)
    numeric = np.concatenate(([0.0], np.cumsum((steps[1:] + steps[:-1]) / 2 * np.diff(t))))
    assert np.max(np.abs(diurnal.cumulative(t) - numeric)) < 0.1
    assert float(diurnal.cumulative(np.array([DAY]))[0]) == pytest.approx(DAY)   # the mean over a day is 1


def test_peak_and_trough_at_the_configured_hours():
    diurnal = Diurnal(amplitude=0.2, peak_hour=14.0)
    hours = np.arange(24) * 3600.0
    assert np.argmax(diurnal.multiplier(hours)) == 14
    assert np.argmin(diurnal.multiplier(hours)) == 2
    assert diurnal.multiplier(np.array([14 * 3600.0]))[0] == pytest.approx(1.2)


def test_inverse_cumulative_undoes_cumulative():
    diurnal = Diurnal(amplitude=0.5)
    t = np.array([0.0, 1.0, 3599.5, 50_000.0, DAY - 1])
    assert inverse_cumulative(diurnal, DAY)(diurnal.cumulative(t)) == pytest.approx(t, abs=0.05)


def test_times_are_sorted_within_the_duration_and_the_count_meets_the_rate():
    arrivals = times(rate=0.5, cv=2.0, diurnal=Diurnal(0.2), duration=DAY)
    assert np.all(np.diff(arrivals) >= 0)
    assert arrivals.min() >= 0 and arrivals.max() < DAY
    # a Gamma renewal's count over a day has sd about cv * sqrt(mean): 2 * 208 = 416 of 43,200
    assert len(arrivals) == pytest.approx(0.5 * DAY, rel=0.04)


@pytest.mark.parametrize("cv", [1.0, 2.0, 4.0])
def test_gaps_have_the_configured_cv_without_the_diurnal_swing(cv):
    gaps = np.diff(times(rate=2.0, cv=cv))
    assert np.mean(gaps) == pytest.approx(0.5, rel=0.05)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(cv, rel=0.08)


def test_the_diurnal_swing_shows_in_hourly_counts():
    arrivals = times(rate=5.0, cv=1.0, diurnal=Diurnal(amplitude=0.2, peak_hour=14.0))
    hourly = np.bincount((arrivals // 3600).astype(int), minlength=24)
    assert hourly[14] / hourly[2] == pytest.approx(1.2 / 0.8, rel=0.05)


def test_first_arrival_is_the_stationary_residual_not_a_fresh_gap():
    """Mean residual of a renewal process is (1 + cv^2) / (2 rate): 5 gaps at cv 3, not 1."""
    firsts = [times(rate=1.0, cv=3.0, duration=200.0, seed=s)[:1] for s in range(4000)]
    assert np.mean(np.concatenate(firsts)) == pytest.approx(5.0, rel=0.1)


def test_rare_deployments_mostly_get_nothing():
    counts = [len(times(rate=1 / (10 * DAY), cv=1.0, seed=s)) for s in range(2000)]
    assert np.mean(counts) == pytest.approx(0.1, abs=0.03)
