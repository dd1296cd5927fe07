"""Compiled views of arrivals: what a constant-rate arrival sees (refinements §6) and the wait
of the prefill-work queue (percentiles §3; the model is documented in prefill_queue.py), one
value at a time for the kernel, and per element of arrays for the numpy assembly.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from model.queueing.kernel.jit import compiled

FloatArray = NDArray[np.float64]

_NEWTON_STEPS = 16  # for the bursty delay probability: converged to 1e-12 up to rho = 0.999


@compiled
def seen_at_constant_rate(service_ms: float, rate_per_ms: float) -> float:
    """Mean number of earlier requests still in service when arrivals come exactly 1/lambda
    apart and time in service is U[S/2, 3S/2]: sum_{k>=1} P(S_r > k/lambda) in closed form."""
    x1 = service_ms / 2.0 * rate_per_ms  # S/2 in units of the arrival spacing
    if not x1 > 0.0:
        return 0.0
    k1 = max(np.ceil(x1) - 1.0, 0.0)  # k with k/lambda < S/2: certainly still present
    k2 = max(np.ceil(3.0 * x1) - 1.0, 0.0)  # k with k/lambda < 3S/2: possibly present
    # On the ramp P(S_r > t) = (3a - t)/(2a) with t = k/lambda; summed over k1 < k <= k2.
    pairs = k2 * (k2 + 1.0) - k1 * (k1 + 1.0)
    return float(k1 + (1.5 * (k2 - k1) - pairs / (4.0 * x1)))


@compiled
def busy_at_constant_rate(service_ms: float, rate_per_ms: float) -> float:
    """P(S_r > 1/lambda): the previous arrival is still in service (engine busy)."""
    x1 = service_ms / 2.0 * rate_per_ms
    if not x1 > 0.0:
        return 0.0
    return min(max((3.0 * x1 - 1.0) / (2.0 * x1), 0.0), 1.0)


@compiled
def bursty_delay_prob(utilization: float, arrival_scv: float) -> float:
    """sigma in (0, 1): the root of sigma = A*(mu (1 - sigma)) for gamma-distributed
    inter-arrival times of squared CV ca2 (shape k = 1 / ca2), A*(s) = (1 + s / (k lambda))^-k,
    i.e. sigma = g(sigma) = (1 + (1 - sigma) / (k rho))^-k; sigma = rho for Poisson arrivals.
    sigma - g is concave and rises through its first root, so Newton's steps from 0 climb
    monotonically to it; 0 at rho = 0."""
    k = 1.0 / arrival_scv
    rho = max(utilization, 1e-300)
    sigma = 0.0
    for _ in range(_NEWTON_STEPS):
        base = 1.0 + (1.0 - sigma) / (k * rho)
        g = base**-k
        slope = 1.0 - base ** (-k - 1.0) / rho  # d(sigma - g) / d sigma, > 0 below the root
        sigma = min(sigma + (g - sigma) / max(slope, 1e-12), 1.0 - 1e-12)
    return sigma if utilization > 0.0 else 0.0


@compiled
def prefill_wait(rate: float, service: float, cs2: float, ca2: float) -> tuple[float, float]:
    """(P(W > 0), E[W | W > 0]) (ms) of the GI/G/1 prefill-work queue at rate lambda (req/ms)
    for prompt work S of mean `service` (ms) and squared CV cs2, arrivals of squared CV ca2
    (prefill_queue.py); (1, +inf) when rho = lambda E[S] >= 1."""
    rho = rate * service
    if not rho < 1.0:
        return 1.0, np.inf
    if ca2 > 1.0:
        # Bursts: P(W > 0) = sigma of gamma-renewal arrivals, tail mean E[S] (1 + cs2) / 2 /
        # (1 - sigma) (exact GI/M/1 for cs2 = 1; Kingman's service factor otherwise).
        sigma = bursty_delay_prob(rho, ca2)
        return sigma, (1.0 + cs2) / 2.0 * service / (1.0 - sigma)
    mean_wait = rho / (1.0 - rho) * (ca2 + cs2) / 2.0 * service  # Kingman
    return rho, (mean_wait / rho if rho > 0.0 else 0.0)


@compiled
def prefill_waits(
    rate: FloatArray, service: FloatArray, cs2: FloatArray, ca2: float
) -> tuple[FloatArray, FloatArray]:
    """`prefill_wait` per element of equal-length 1-D arrays."""
    delay, tail = np.empty(rate.shape[0]), np.empty(rate.shape[0])
    for j in range(rate.shape[0]):
        delay[j], tail[j] = prefill_wait(rate[j], service[j], cs2[j], ca2)
    return delay, tail


@compiled
def constant_rate_views(
    service: FloatArray, rate: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """`seen_at_constant_rate` and `busy_at_constant_rate` per element of 1-D arrays."""
    seen, busy = np.empty(rate.shape[0]), np.empty(rate.shape[0])
    for j in range(rate.shape[0]):
        seen[j] = seen_at_constant_rate(service[j], rate[j])
        busy[j] = busy_at_constant_rate(service[j], rate[j])
    return seen, busy


@compiled
def bursty_delay_probs(utilization: FloatArray, arrival_scv: float) -> FloatArray:
    """`bursty_delay_prob` per element of a 1-D array."""
    out = np.empty(utilization.shape[0])
    for j in range(utilization.shape[0]):
        out[j] = bursty_delay_prob(utilization[j], arrival_scv)
    return out


@compiled
def wait_quantile(delay_prob: float, tail_ms: float, stable: bool, level: float) -> float:
    """The prefill-work wait (ms) at probability level u in [0, 1): 0 up to 1 - P(W > 0), the
    exponential tail of mean E[W | W > 0] beyond; +inf when the queue is unstable."""
    if not stable:
        return np.inf
    if not level > 1.0 - delay_prob:
        return 0.0
    above = max(1.0 - level, 1e-300) / max(delay_prob, 1e-300)
    return float(-tail_ms * np.log(min(above, 1.0)))


@compiled
def wait_quantiles(
    delay_prob: FloatArray, tail_ms: FloatArray, stable: NDArray[np.bool_], levels: FloatArray
) -> FloatArray:
    """`wait_quantile` for each rate (rows, 1-D arrays) at each level (columns)."""
    out = np.empty((delay_prob.shape[0], levels.shape[0]))
    for r in range(delay_prob.shape[0]):
        for j in range(levels.shape[0]):
            out[r, j] = wait_quantile(delay_prob[r], tail_ms[r], stable[r], levels[j])
    return out
