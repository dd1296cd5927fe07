"""Distributions of the occupancy (requests in the system), as the percentile assembly needs them.
Percentiles §3.

All are probability mass functions over 0..B (shape (rates, B+1)) whose last entry lumps every
state i >= B: beyond B only the wait for a slot depends on i, and for the chain's geometric tail
that wait is exponential whatever i (see model/queueing/percentiles.py).

* The chain's stationary distribution pi_i (spec §5; computed with the chain by
  model/queueing/kernel/chain.py): what a Poisson arrival sees (PASTA) and the time average.
* Constant-rate arrivals spaced 1/lambda apart with time in service U[S/2, 3S/2] (refinements §6):
  the count of earlier arrivals still present is a sum of Bernoulli(P(S_r > k/lambda)), k >= 1,
  taken as Normal with that sum's mean and variance and rounded to the nearest state.
* Other arrival CVs mix the two linearly in the squared CV (capped at the Poisson view), as the
  mean assembly does.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy.special import ndtr

from model.queueing.chain import StateTable
from model.queueing.kernel import samples as kernel_samples
from model.queueing.refined import seen_at_constant_rate
from model.queueing.sample_points import unit_order, unit_points

FloatArray = NDArray[np.float64]


def constant_rate_pmf(
    service_ms: FloatArray, rate_per_ms: FloatArray, mean: FloatArray, big_b: int
) -> FloatArray:
    """Occupancy over 0..B (B lumps >= B) under constant-rate arrivals: Normal with the given
    mean and the variance of the Bernoulli sum sum_k P(S_r > k/lambda), S_r ~ U[S/2, 3S/2]."""
    a = service_ms / 2.0
    x1 = a * rate_per_ms  # S/2 in units of the arrival spacing
    k_max = int(np.clip(np.ceil(3.0 * x1.max(initial=0.0)) + 1, 1, 8 * big_b))
    k = np.arange(1, k_max + 1, dtype=np.float64)[np.newaxis, :]
    safe = np.where(x1 > 0.0, x1, 1.0)[:, np.newaxis]
    # P(S_r > k / lambda) = (3a - k/lambda) / (2a) on the ramp, clipped to [0, 1].
    p = np.clip((3.0 * safe - k) / (2.0 * safe), 0.0, 1.0) * (x1 > 0.0)[:, np.newaxis]
    sd = np.sqrt((p * (1.0 - p)).sum(axis=1))[:, np.newaxis]
    edges = np.arange(big_b + 1, dtype=np.float64)[np.newaxis, :] + 0.5  # between states
    mu = mean[:, np.newaxis]
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(sd > 0.0, (edges - mu) / np.where(sd > 0.0, sd, 1.0),
                     np.where(edges > mu, np.inf, -np.inf))
    cdf = ndtr(z)
    cdf[:, -1] = 1.0
    pmf = np.diff(cdf, axis=1, prepend=0.0)
    out: FloatArray = np.maximum(pmf, 0.0)
    return out


def arrival_pmf(
    table: StateTable,
    pmf: FloatArray,
    service_ms: FloatArray,
    rate_per_ms: FloatArray,
    arrival_cv: float,
) -> FloatArray:
    """The occupancy an arrival sees: the chain's pmf for Poisson arrivals, the constant-rate
    view for arrival_cv = 0, mixed linearly in arrival_cv^2 between them."""
    share = min(arrival_cv**2, 1.0)
    if share >= 1.0:
        return pmf
    seen = seen_at_constant_rate(service_ms, rate_per_ms)
    const = constant_rate_pmf(service_ms, rate_per_ms, seen, table.max_batch_size)
    # An unstable rate keeps the chain's all-at-B view whatever the arrival process.
    const = np.where(pmf[:, -1:] >= 1.0, pmf, const)
    mixed: FloatArray = share * pmf + (1.0 - share) * const
    return mixed


def time_average_pmf(
    table: StateTable, pmf: FloatArray, service_ms: FloatArray, rate_per_ms: FloatArray,
    occupancy: FloatArray, arrival_cv: float,
) -> FloatArray:
    """The occupancy at a random time: the chain's pmf for Poisson arrivals; for constant-rate
    arrivals the Normal view centred on the chain's mean occupancy X-bar."""
    share = min(arrival_cv**2, 1.0)
    if share >= 1.0:
        return pmf
    const = constant_rate_pmf(service_ms, rate_per_ms, occupancy, table.max_batch_size)
    const = np.where(pmf[:, -1:] >= 1.0, pmf, const)
    mixed: FloatArray = share * pmf + (1.0 - share) * const
    return mixed


def inverse_cdf(pmf: FloatArray, dims: int, row: int) -> NDArray[np.intp]:
    """State drawn from each row's pmf at every level u of the sample points
    `unit_points(dims)[row]`: the smallest i with P(state <= i) > u. Shape (rates, POINTS).
    The points' sort order is cached with them (sample_points.unit_order)."""
    cdf = np.cumsum(pmf, axis=1)
    cdf /= cdf[:, -1:]
    levels, order = unit_points(dims)[row], unit_order(dims)[row]
    drawn: NDArray[np.intp] = kernel_samples.states_at_levels(cdf, levels, order)
    return drawn
