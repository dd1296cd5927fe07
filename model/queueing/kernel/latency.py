"""Compiled per-point latencies of the percentile assembly (model/queueing/latency_samples.py
documents the model): TTFT at each sample point and each rate, and the prefill work of a prompt.

Each point is evaluated in one pass, operation for operation as the numpy expressions it
replaced did (same order of operations; `_max` and `_min` keep numpy's NaN propagation), so
the only differences are the last-bit ones of the library's log against numpy's.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from model.queueing.kernel.arrivals import wait_quantile
from model.queueing.kernel.jit import compiled
from model.queueing.kernel.samples import count_at

FloatArray = NDArray[np.float64]

MAX_PREFILL_SHARE = 0.999  # the decode share 1 - rho of time never falls below this complement
NORMAL_ABOVE = 40.0  # Poisson counts of larger means drawn from the Normal approximation
# Per-point inputs of `ttft_points` (rows of its `points` argument).
(U_POS, U_K, U_BIAS, U_AHEAD, U_AFTER, U_WAIT, U_KIND, Z_K, Z_AHEAD, Z_AFTER, PROMPT, PREVIOUS,
 SLOT_LOG, LOG_K, LOG_AHEAD, LOG_AFTER) = range(16)  # fmt: skip
POINT_ROWS = 16
# A Poisson count is 0 when exp(-mean) >= u. Where -mean exceeds log(u) by this much, exp(-mean)
# is above u whatever the last-bit errors of exp and log, so the count is 0 without the exp.
_CLEARLY_ABOVE = 1e-9


@compiled
def _max(a: float, b: float) -> float:
    """numpy's maximum: NaN if either is."""
    return a if (a >= b or a != a) else b


@compiled
def _min(a: float, b: float) -> float:
    """numpy's minimum: NaN if either is."""
    return a if (a <= b or a != a) else b


@compiled
def prefill_work(beta: float, gamma: float, kappa: float, n: float, chunks: float) -> float:
    """W_pref(n, c) = beta n + gamma n (c + 1) / 2 + beta kappa n^2 / 2 (ms)."""
    return beta * n + gamma * n * (chunks + 1.0) / 2.0 + beta * kappa * n * n / 2.0


@compiled
def prefill_works(
    beta: float, gamma: float, kappa: float, n: FloatArray, chunks: FloatArray
) -> FloatArray:
    """`prefill_work` per element of equal-length 1-D arrays."""
    out = np.empty(n.shape[0])
    for j in range(n.shape[0]):
        out[j] = prefill_work(beta, gamma, kappa, n[j], chunks[j])
    return out


@compiled
def _poisson(mean: float, level: float, log_level: float, z: float) -> float:
    """A Poisson(mean) count at level u (log_level = log u, z its Normal quantile): 0 at once
    where exp(-mean) is clearly at least u (mostly so at the means TTFT meets, and the exp and
    the branch on it were most of a point's time), else `count_at`."""
    if -mean > log_level + _CLEARLY_ABOVE:
        return 0.0
    return count_at(mean, level, z, NORMAL_ABOVE)


@compiled
def _count(mean: float, level: float, log_level: float, z: float, poisson: bool) -> float:
    """Arrivals in a window of this mean count at level u: Poisson, or floor(mean) for a
    constant-rate stream in a window that starts at an arrival."""
    return _poisson(mean, level, log_level, z) if poisson else np.floor(mean)


@compiled
def ttft_points(
    state: NDArray[np.intp],
    rate: FloatArray,
    rate_values: FloatArray,
    stable: NDArray[np.bool_],
    queue_stable: NDArray[np.bool_],
    points: FloatArray,
    chunks: FloatArray,
    work: FloatArray,
    shape: FloatArray,
) -> FloatArray:
    """TTFT (ms) at each rate (rows) and sample point (columns).

    state: the occupancy an arrival finds per (rate, point); rate: lambda (req/ms);
    rate_values rows: the prefill queue's P(W > 0) and E[W | W > 0], the mean slot wait;
    points: POINT_ROWS rows per point (the unit levels, the Normal quantiles of the count
    levels, the prompt's length, the previous prompt's length, log(1 - u) of the slot wait,
    the logs of the count levels);
    chunks: the chain's c(x + 1) per decoding count x; work: beta, gamma, kappa, the mean prefill
    work E[W_pref] and its share per prompt token; shape: B, the budget M, alpha, d, the mean
    prompt length (at least 1), the Poisson share of arrivals min(ca2, 1) and 1 to add the first
    decode iteration (0 not)."""
    beta, gamma, kappa, work_mean, per_token = work[0], work[1], work[2], work[3], work[4]
    big_b, budget, alpha, decode = shape[0], shape[1], shape[2], shape[3]
    n_bar, poisson_share, after_decode = shape[4], shape[5], shape[6] > 0.0
    last = max(big_b - 1.0, 0.0)
    out = np.empty(state.shape)
    for r in range(state.shape[0]):
        lam = rate[r]
        share = _min(lam * work_mean, MAX_PREFILL_SHARE)
        for j in range(state.shape[1]):
            if not stable[r]:
                out[r, j] = np.inf
                continue
            u_pos, u_k, u_bias = points[U_POS, j], points[U_K, j], points[U_BIAS, j]
            poisson = points[U_KIND, j] < poisson_share
            i = state[r, j]
            x = min(float(i), last)
            d_iter = alpha + x * decode
            room = _max(budget - x, 1.0)
            # The iteration in progress (engine busy): D(x) plus the prompts admitted at its
            # start, K of them, length-biased: Poisson(mu) with weight D / (D + mu P), 1 +
            # Poisson(mu) else; constant-rate arrivals: floor(mu) prompts, one more with
            # probability frac(mu), unbiased.
            mu = lam * d_iter / (1.0 - share)
            biased = u_bias < mu * work_mean / (d_iter + mu * work_mean)
            k = _poisson(mu, u_k, points[LOG_K, j], points[Z_K, j]) + (1.0 if biased else 0.0)
            if not poisson:
                k = np.floor(mu + u_k)
            content = _min(k * n_bar, room) * per_token
            busy = i >= 1
            in_progress = d_iter + content if busy else 0.0
            # Arrivals during its elapsed part are ahead of the request, later ones may join it.
            ahead = _count(lam * (1.0 - u_pos) * in_progress, points[U_AHEAD, j],
                           points[LOG_AHEAD, j], points[Z_AHEAD, j], poisson)  # fmt: skip
            joining = _count(lam * u_pos * in_progress, points[U_AFTER, j],
                             points[LOG_AFTER, j], points[Z_AFTER, j], poisson)  # fmt: skip
            n = points[PROMPT, j]
            ahead_tokens = _min(ahead * n_bar, room)
            queued = wait_quantile(rate_values[0, r], rate_values[1, r], queue_stable[r],
                                   points[U_WAIT, j])  # fmt: skip
            residual = u_pos * (d_iter if busy else 0.0)
            wait = residual + _max(queued, u_pos * (content if busy else 0.0)
                                   + ahead_tokens * per_token)  # fmt: skip
            if not poisson:
                # A constant-rate arrival at light load (mu < 1) comes 1/lambda after the
                # previous one, which waited U' D for its own prefill iteration D + W_pref(n'):
                # it waits out what is left of that iteration, or of a decode iteration. From
                # mu = 1 on, the longer of this and the batch view, so that the wait only grows
                # with the rate.
                prev = prefill_work(beta, gamma, kappa, _min(points[PREVIOUS, j], room), 1.0)
                left = (u_bias * d_iter + d_iter + prev - 1.0 / _max(lam, 1e-300)
                        if busy else 0.0)  # fmt: skip
                steady = _max(left, residual) + _max(queued, ahead_tokens * per_token)
                wait = steady if mu < 1.0 else _max(wait, steady)
            # At least the chunks the budget forces; a mean-size prompt takes the chain's
            # c(x + 1), scaled with its length.
            c = _max(np.ceil(n / room), np.floor(chunks[int(min(x, big_b - 1.0))] * n / n_bar
                                                 + 1e-9))  # fmt: skip
            c = _max(c, 1.0)
            own = c * d_iter + prefill_work(beta, gamma, kappa, n, c)
            joined = _min(joining * n_bar, _max(room - n - ahead_tokens, 0.0)) * per_token
            slot = -rate_values[2, r] * points[SLOT_LOG, j] if i >= big_b else 0.0
            ttft = slot + wait + own + joined
            if after_decode:
                ttft = ttft + d_iter + decode
            out[r, j] = ttft
    return out


@compiled
def gamma_base(mean: float, var: float, z: float) -> float:
    """The quantile at level u = Phi(z) of the gamma law with this mean and variance is
    mean b^3 (Wilson-Hilferty's cube-root normal approximation, b = max(1 - c + z sqrt(c), 0),
    c = 1 / (9 k), k = mean^2 / var kept in [1e-12, 1e12]: beyond it the law is a point or a
    spike at 0 for all practical purposes): b, or 1 (the mean itself) unless mean and
    variance are positive and the mean finite. The cube is left to numpy's vectorised power,
    several times faster than the library's pow one element at a time."""
    if not (mean > 0.0 and var > 0.0 and np.isfinite(mean)):
        return 1.0
    shape = min(max(mean / var * mean, 1e-12), 1e12)
    c = 1.0 / (9.0 * shape)
    return _max(1.0 - c + z * np.sqrt(c), 0.0)


@compiled
def gamma_bases(mean: FloatArray, var: FloatArray, z: FloatArray) -> FloatArray:
    """`gamma_base` per element of equal-length 1-D arrays."""
    out = np.empty(mean.shape[0])
    for j in range(mean.shape[0]):
        out[j] = gamma_base(mean[j], var[j], z[j])
    return out


@compiled
def previous_iteration(
    state: NDArray[np.intp], rate: FloatArray, terms: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Per rate (rows) and prefill-carrying iteration (columns): the mean and variance (ms,
    ms^2) of the iteration before it, whose arrivals it admits: E[T] = D(x) / (1 - rho) and
    Var T = lambda E[T] E[W^2] / (1 - rho^2). state: its decoding count x; terms: alpha, d,
    E[W_pref], E[W_pref^2]."""
    alpha, decode, work_mean, work_square = terms[0], terms[1], terms[2], terms[3]
    mean = np.empty(state.shape)
    var = np.empty(state.shape)
    for r in range(state.shape[0]):
        lam = rate[r]
        rho = _min(lam * work_mean, MAX_PREFILL_SHARE)
        for j in range(state.shape[1]):
            mean[r, j] = (alpha + state[r, j] * decode) / (1.0 - rho)
            var[r, j] = lam * mean[r, j] * work_square / (1.0 - rho * rho)
    return mean, var


@compiled
def token_weights(
    pmf: FloatArray, rate: FloatArray, terms: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Per rate (rows) and state x = 0..B (columns): the token share of decode-only iterations
    and of prefill-carrying ones, and the latter as drawn (a request alone at x = 1 when no
    occupancy is resolvable). Tokens come at x per iteration and (1 - rho) / D(x) iterations
    per ms; a share f(x) = 1 - exp(-mu), mu = lambda D(x) / (1 - rho), of iterations carries
    prefill work (Poisson arrivals), min(mu, 1) (constant-rate ones). pmf: the time-average
    occupancy; terms: alpha, d, E[W_pref], the Poisson share of arrivals min(ca2, 1)."""
    alpha, decode, work_mean, poisson = terms[0], terms[1], terms[2], terms[3]
    decode_only, carrying, drawn = np.empty(pmf.shape), np.empty(pmf.shape), np.empty(pmf.shape)
    for r in range(pmf.shape[0]):
        lam = rate[r]
        rho = _min(lam * work_mean, MAX_PREFILL_SHARE)
        for x in range(pmf.shape[1]):
            d_state = alpha + x * decode
            weight = x * pmf[r, x] * (1.0 - rho) / d_state
            if x == 1:
                weight = weight + 1e-300
            mu = lam * d_state / (1.0 - rho)
            carries = poisson * -np.expm1(-mu) + (1.0 - poisson) * (mu if mu < 1.0 else 1.0)
            decode_only[r, x] = weight * (1.0 - carries)
            carrying[r, x] = weight * carries
            drawn[r, x] = carrying[r, x] + (1e-300 if x == 1 else 0.0)
    return decode_only, carrying, drawn


@compiled
def prefill_gaps(
    state: NDArray[np.intp],
    mean: FloatArray,
    level: FloatArray,
    z: FloatArray,
    stable: NDArray[np.bool_],
    points: FloatArray,
    terms: FloatArray,
) -> FloatArray:
    """Per rate (rows) and prefill-carrying iteration (columns): its length (ms), D(x) plus the
    prefill work of its prompts' tokens, the first prompt's n1 and k - 1 mean ones, at most the
    budget M - x; +inf at unstable rates. mean, level: of its Poisson count K;
    z: the standard Normal quantile of the level where the mean exceeds NORMAL_ABOVE (else
    unread); points rows: the level of K, the level of the first prompt's length and the
    arrival kind, n1; terms: alpha, d, the mean prompt length (at least 1), E[W_pref] per prompt
    token, M, the Poisson share of arrivals min(ca2, 1) (constant-rate iterations admit floor or
    ceil of mu prompts, at least one)."""
    alpha, decode, n_bar, per_token = terms[0], terms[1], terms[2], terms[3]
    budget, poisson_share = terms[4], terms[5]
    out = np.empty(state.shape)
    for r in range(state.shape[0]):
        for j in range(state.shape[1]):
            if not stable[r]:
                out[r, j] = np.inf
                continue
            mu = mean[r, j]
            if points[1, j] < poisson_share:
                k = count_at(mu, level[r, j], z[r, j], NORMAL_ABOVE)
            else:
                k = 1.0 if mu < 1.0 else np.floor(mu + points[0, j])
            k = _max(k, 1.0)
            x = float(state[r, j])
            tokens = _min(points[2, j] + (k - 1.0) * n_bar, _max(budget - x, 1.0))
            out[r, j] = alpha + x * decode + tokens * per_token
    return out
