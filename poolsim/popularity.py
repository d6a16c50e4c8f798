"""How busy each deployment is: its mean arrival rate, and how bursty its arrivals are.

Rates. Shahrad et al., "Serverless in the Wild" (USENIX ATC'20), Fig. 5(a),
the CDF of average daily invocations per application of Azure Functions
(two weeks of July 2019): 45% of applications are invoked at most once an
hour on average (<= 24 a day) and 81% at most once a minute (<= 1440 a day),
over a range of 8 orders of magnitude. A normal in log10(invocations a day)
through those two points has mu 1.603 (median 40 a day) and sigma 1.772
decades. n deployments get its quantiles at (i + 0.5) / n, in a random order:
stratified rather than drawn, so the population meets the published CDF at
any n and a day's total does not hinge on one draw from the far tail. With
200 deployments the quantiles span 1e-3.4 to 1e6.6 a day and total 5.9M
requests a day (68/s), 64% of them to the busiest deployment (the paper's
Fig. 5(b): the most popular 18.6% of applications take 99.6% of invocations).

Burstiness. The same paper, Fig. 6, the CDF of the coefficient of variation
(CV) of inter-arrival times per application, for applications without timer
triggers (HTTP, queue, event: the shape of inference traffic): about 35% at
CV <= 1, 55% <= 2, 76% <= 4, 90% <= 8. A log-normal CV with median 1.7 and
sigma 1.21 (of ln CV) passes within 0.02 of each. Draws are clipped to a
range, [1, 4] by default: at least Poisson (BurstGPT, Wang et al. 2024, finds
LLM arrivals burstier than Poisson and fits them with Gamma inter-arrival
times), at most 4 so the Gamma shape 1/CV^2 stays >= 1/16, where gaps are not
yet mostly zero. (The Azure LLM trace of 2023 shows CV 1.09 for conversation
and 13 for code over its hour, the latter from a few huge bursts.)
"""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

SECONDS_A_DAY = 86_400.0
_STANDARD = NormalDist()


def _normal_through(x1: float, p1: float, x2: float, p2: float) -> tuple[float, float]:
    """(mu, sigma) of the normal whose CDF is p1 at x1 and p2 at x2."""
    z1, z2 = _STANDARD.inv_cdf(p1), _STANDARD.inv_cdf(p2)
    sigma = (x2 - x1) / (z2 - z1)
    return x1 - z1 * sigma, sigma


# Fig. 5(a): 45% of applications at <= 24 invocations a day, 81% at <= 1440
RATE_LOG10_MU, RATE_LOG10_SIGMA = _normal_through(math.log10(24), 0.45, math.log10(1440), 0.81)
CV_MEDIAN = 1.7
CV_LN_SIGMA = 1.21


def daily_rates(n: int) -> np.ndarray:
    """Mean invocations a day of n deployments: the fitted quantiles at (i + 0.5) / n, ascending."""
    z = [_STANDARD.inv_cdf((i + 0.5) / n) for i in range(n)]
    return np.power(10.0, RATE_LOG10_MU + RATE_LOG10_SIGMA * np.array(z))


def rates_per_s(rng: np.random.Generator, n: int, scale: float) -> np.ndarray:
    """Mean arrival rates a second of n deployments, in a random order, times scale."""
    return rng.permutation(daily_rates(n)) / SECONDS_A_DAY * scale


def burst_cvs(rng: np.random.Generator, n: int, cv_range: tuple[float, float]) -> np.ndarray:
    """Coefficients of variation of the inter-arrival times of n deployments."""
    cvs = rng.lognormal(math.log(CV_MEDIAN), CV_LN_SIGMA, n)
    return np.clip(cvs, *cv_range)
