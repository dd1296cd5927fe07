"""Compiled solution of the birth-death chain at one rate. Spec §5.

p_i = p_0 prod_{j<=i} lambda / mu_j. The log-weights log p_i - log p_0 = i log(lambda) -
sum_{j<=i} log mu_j locate the largest state; the weights relative to it are then built by the
recurrence p_{i+1} = p_i lambda / mu_{i+1} upwards and p_{i-1} = p_i mu_i / lambda downwards:
one multiplication a state instead of an exp (several times cheaper; rounding grows by at most
an ulp a step, under 1e-12 relative at B = 4096). The two end weights, p_0 and p_B, reported on
their own, are exp(log-weight - max) as before. A weight that has fallen below RESEED is rebuilt
from its log instead (the chain need not be unimodal where the chunk count steps), and one whose
log lies below NEGLIGIBLE_LOG of the largest is 0: at most (B + 1) e^-700 < 1e-300 next to a sum
that holds a 1, so no sum changes, and exp never takes its slow path for such arguments.

The waiting room beyond B is infinite (the tail is geometric with ratio r = lambda / mu_B,
stable iff r < 1) or holds Q requests (states B+1..B+Q, summed as they are).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from model.queueing.kernel.jit import compiled
from model.queueing.kernel.table import (
    CUM_LOG_MU,
    CUM_LOG_MU_B,
    INV_MU,
    LOG_MU_B,
    MAX_MU,
    MIN_MU,
    MU,
    TAU,
    WHOLE,
    ensure_logs,
)

FloatArray = NDArray[np.float64]

TINY_RATE = 1e-300  # req/ms; stands in for 0 in log space: every p_i (i > 0) underflows to 0
RESEED = 1e-290  # a weight (relative to the peak) below this is rebuilt from its log
NEGLIGIBLE_LOG = -700.0  # weights below e^this of the peak count as 0
# States left out once all of them together hold less than this share of the sums: far
# below half an ulp (1.1e-16), so the sums are those of every state.
DROP = 1e-18
# Outputs of `solve` (a length-CHAIN_FIELDS vector per rate).
STABLE, NUM, OCC, QUEUE, P_EMPTY, P_WAIT, P_BLOCK, LOG_R = range(8)
CHAIN_FIELDS = 8


@compiled
def log_weights(states: FloatArray, row: int, big_b: int, log_lam: float, log_p: FloatArray) -> int:
    """log_p[i] = log p_i - log p_0 for i = 0..B; returns the index of the largest."""
    cum = states[row, CUM_LOG_MU]
    top = 0
    log_p[0] = 0.0 * log_lam - cum[0]
    best = log_p[0]
    for i in range(1, big_b + 1):
        v = i * log_lam - cum[i]
        log_p[i] = v
        if v > best:
            best, top = v, i
    return top


@compiled
def first_peak(states: FloatArray, row: int, big_b: int, lam: float) -> int:
    """The state before the first i with mu_i >= lambda (B if none): the weights rise up to it
    (binary search on the running maximum of mu)."""
    max_mu = states[row, MAX_MU]
    lo, hi = 0, big_b  # the answer i* - 1 lies in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if max_mu[mid] >= lam:  # state mid + 1 is the first or past it
            hi = mid
        else:
            lo = mid + 1
    return lo


@compiled
def _rebuilt(
    states: FloatArray, rows: FloatArray, row: int, i: int, log_lam: float, log_top: float
) -> float:
    ensure_logs(states, rows, row, i)
    d = i * log_lam - states[row, CUM_LOG_MU, i] - log_top
    return math.exp(d) if d > NEGLIGIBLE_LOG else 0.0


@compiled
def unit_weights(
    states: FloatArray, rows: FloatArray, row: int, big_b: int, lam: float, log_lam: float,
    w: FloatArray,
) -> tuple[float, float, int, int]:
    """w[i] = p_i / p_top for the states that count (recurrence from the first peak, ends
    exact); returns (sum w, sum i w, lowest, highest interior state filled). Of a lazy row's
    logs (kernel/table.py) only those up to the peak and of states rebuilt are computed."""
    tau, mu, min_mu = states[row, TAU], states[row, MU], states[row, MIN_MU]
    inv_mu, whole = states[row, INV_MU], rows[row, WHOLE] > 0.0
    cum = states[row, CUM_LOG_MU]
    top = first_peak(states, row, big_b, lam)
    ensure_logs(states, rows, row, top)
    log_top = top * log_lam - cum[top]
    w[0] = math.exp(0.0 * log_lam - cum[0] - log_top)
    w[big_b] = math.exp(big_b * log_lam - rows[row, CUM_LOG_MU_B] - log_top)
    total = w[0] + w[big_b]
    first = big_b * w[big_b]
    if 0 < top < big_b:
        w[top] = 1.0
        total += 1.0
        first += top
    # Below the peak the weights fall state by state: stop once the rest cannot reach
    # DROP of the sums (at most i states of at most w_i each).
    x, low = 1.0, max(top, 1)
    inv_lam = 1.0 / lam
    for i in range(top - 1, 0, -1):
        x = x * (mu[i] * inv_lam)
        w[i] = x
        total += x
        first += i * x
        low = i
        if i * x <= DROP * total and i * i * x <= DROP * first:
            break
    # Above it they may dip and rise again where the chunk count steps: stop only where no
    # later state can rise (lambda <= every later mu) and the rest is negligible.
    x, high = 1.0, min(top, big_b - 1)
    for i in range(top + 1, big_b):
        if x >= RESEED:
            # 1 / mu_i: a lazy row's computed where it is needed, the same number.
            x = x * (lam * (inv_mu[i - 1] if whole else tau[i - 1] / float(i)))
        else:
            x = _rebuilt(states, rows, row, i, log_lam, log_top)
        w[i] = x
        total += x
        first += i * x
        high = i
        room = big_b - i
        rising = lam > min_mu[i]
        if not rising and room * x <= DROP * total and room * big_b * x <= DROP * first:
            break
    return total, first, low, high


@compiled
def solve(
    states: FloatArray, rows: FloatArray, row: int, big_b: int, max_queue: int, lam: float,
    log_p: FloatArray, w: FloatArray, out: FloatArray,
) -> tuple[int, int]:
    """The chain at rate lam (req/ms) into out[STABLE..LOG_R]; w holds the head weights
    relative to a peak (for `pmf`) on the returned range of states and at 0 and B."""
    safe_lam = max(lam, TINY_RATE)
    log_lam = math.log(safe_lam)
    log_r = log_lam - rows[row, LOG_MU_B]  # log(lambda / mu_B): the ratio beyond B
    out[P_BLOCK], out[LOG_R] = 0.0, log_r
    if max_queue >= 0:
        ensure_logs(states, rows, row, big_b)
        top = log_weights(states, row, big_b, log_lam, log_p)
        _solve_finite(big_b, max_queue, log_p, log_r, top, w, out)
        return 1, big_b - 1
    stable = log_r < 0.0
    out[STABLE] = 1.0 if stable else 0.0
    if not stable:
        out[NUM], out[OCC], out[QUEUE] = np.nan, float(big_b), np.nan
        out[P_EMPTY], out[P_WAIT] = 0.0, 1.0
        return 1, 0
    total, first, low, high = unit_weights(states, rows, row, big_b, safe_lam, log_lam, w)
    r = math.exp(log_r)
    # Tail i > B is geometric: mass p_B r/(1-r), queue length p_B r/(1-r)^2.
    tail_per_p_b = r / (1.0 - r)
    denom = total + w[big_b] * tail_per_p_b
    tail_mass = w[big_b] / denom * tail_per_p_b
    queue = tail_mass / (1.0 - r)
    occupancy = first / denom + big_b * tail_mass
    out[NUM], out[OCC], out[QUEUE] = occupancy + queue, occupancy, queue
    out[P_EMPTY], out[P_WAIT] = w[0] / denom, tail_mass
    return low, high


@compiled
def _solve_finite(
    big_b: int, max_queue: int, log_p: FloatArray, log_r: float, top: int, w: FloatArray,
    out: FloatArray,
) -> None:
    # States B+1..B+Q continue geometrically with ratio lambda / mu_B; summed exactly.
    head_best = log_p[top]
    best = head_best
    for k in range(1, max_queue + 1):
        best = max(best, log_p[big_b] + k * log_r)
    total, first = 0.0, 0.0
    for i in range(big_b + 1):
        w[i] = math.exp(log_p[i] - head_best)
        p = math.exp(log_p[i] - best)
        total += p
        first += i * p
    p_empty = math.exp(log_p[0] - best)
    tail, queue, last = 0.0, 0.0, math.exp(log_p[big_b] - best)
    for k in range(1, max_queue + 1):
        last = math.exp(log_p[big_b] + k * log_r - best)
        tail += last
        queue += k * last
    total += tail
    out[STABLE] = 1.0
    out[P_WAIT], out[QUEUE], out[P_EMPTY] = tail / total, queue / total, p_empty / total
    out[OCC] = first / total + big_b * out[P_WAIT]
    out[NUM] = out[OCC] + out[QUEUE]
    out[P_BLOCK] = last / total


@compiled
def pmf(
    big_b: int, max_queue: int, log_r: float, w: FloatArray, filled: tuple[int, int],
    stable: bool, out: FloatArray,
) -> None:
    """pi_i for i = 0..B-1 and P(i >= B) into out[0..B], from the head weights w of `solve`
    (0 outside the states it filled); unstable rates put all mass on B."""
    out[:] = 0.0
    out[0], out[big_b] = w[0], w[big_b]
    for i in range(filled[0], filled[1] + 1):
        out[i] = w[i]
    if not stable:
        out[:] = 0.0
        out[big_b] = 1.0
        return
    r = math.exp(min(log_r, 0.0))
    if max_queue < 0:
        out[big_b] /= 1.0 - r  # p_B (1 + r + r^2 + ...) lumped into state B
    else:
        # p_B (1 + r + ... + r^Q) as a geometric sum; r = 1 gives Q + 1.
        if abs(log_r) < 1e-12:
            geo = max_queue + 1.0
        else:
            geo = math.expm1((max_queue + 1) * log_r) / math.expm1(log_r)
        if not math.isfinite(geo) or geo > 1e250:  # far overload: the tail dwarfs the head
            out[:] = 0.0
            out[big_b] = 1.0
            return
        out[big_b] *= geo
    total = 0.0
    for i in range(big_b + 1):
        total += out[i]
    for i in range(big_b + 1):
        out[i] /= total
