"""When one deployment's requests arrive: a Gamma renewal process on a diurnal clock.

Load follows the day: the rate is mean * (1 + amplitude * cos(2 pi (t - peak) / day)).
Azure Functions' invocations per hour swing between about 0.8 and 1.2 of
their mean over the day (Shahrad et al., ATC'20, Fig. 4), so the default
amplitude is 0.2: a peak 1.5 times the trough. The trace's t = 0 is midnight
and the peak at 14:00 by default.

Burstiness comes from the gaps: they are Gamma with mean 1 and a given CV
(shape 1/CV^2; CV 1 is Poisson), counted in expected arrivals rather than
seconds. Time rescaling maps the k-th arrival's count c_k to the time t with
rate * D(t) = c_k, where D(t) is the integral of the diurnal multiplier; so
the day's shape and the burstiness compose without thinning. D is inverted by
interpolation on a one-minute grid, which is exact for a rate held constant
within each minute.

The first arrival comes from the stationary residual gap (a length-biased
gap, Gamma(shape + 1), times a uniform), so the trace starts mid-stream
rather than with every deployment arriving at t = 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from poolsim.popularity import SECONDS_A_DAY

GRID_S = 60.0
_MIN_CHUNK = 16
_MAX_CHUNK = 16_384


@dataclass(frozen=True, slots=True)
class Diurnal:
    amplitude: float = 0.2           # in [0, 1): the rate swings by +-amplitude of its mean
    peak_hour: float = 14.0          # hours after the trace's start

    def multiplier(self, t: np.ndarray) -> np.ndarray:
        multiplier: np.ndarray = 1.0 + self.amplitude * np.cos(self._phase(t))
        return multiplier

    def cumulative(self, t: np.ndarray) -> np.ndarray:
        """D(t): the integral of the multiplier from 0 to t, in seconds."""
        swing = self.amplitude * SECONDS_A_DAY / (2 * math.pi)
        cumulative: np.ndarray = t + swing * (np.sin(self._phase(t)) - np.sin(self._phase(np.zeros(1))))
        return cumulative

    def _phase(self, t: np.ndarray) -> np.ndarray:
        return 2 * math.pi * (t - self.peak_hour * 3600.0) / SECONDS_A_DAY


def inverse_cumulative(diurnal: Diurnal, duration_s: float) -> Callable[[np.ndarray], np.ndarray]:
    """t for D(t) on [0, duration_s], by interpolation on a one-minute grid."""
    grid = np.append(np.arange(0.0, duration_s, GRID_S), duration_s)
    cumulative = diurnal.cumulative(grid)
    return lambda d: np.interp(d, cumulative, grid)


def arrival_times(rng: np.random.Generator, rate_per_s: float, cv: float, diurnal: Diurnal,
                  duration_s: float) -> Iterator[np.ndarray]:
    """Arrival times in [0, duration_s), ascending, in chunks (float64 [n] each)."""
    shape = 1.0 / cv ** 2
    to_time = inverse_cumulative(diurnal, duration_s)
    end = rate_per_s * float(diurnal.cumulative(np.array([duration_s]))[0])   # expected count by the end
    size = int(min(_MAX_CHUNK, max(_MIN_CHUNK, end / 16)))
    following = rng.gamma(shape + 1.0, 1.0 / shape) * rng.random()           # count of the next arrival
    while following < end:
        gaps = rng.gamma(shape, 1.0 / shape, size)
        counts = following + np.concatenate(([0.0], np.cumsum(gaps[:-1])))
        following = counts[-1] + gaps[-1]
        counts = counts[:np.searchsorted(counts, end)]
        yield to_time(counts / rate_per_s)
