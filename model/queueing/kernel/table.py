"""Compiled construction of the per-occupancy state table. Spec §2-4, refinements §6.

For each request shape (a row: n prompt tokens, of which n_c = (1 - h) n are computed with a
prefix-cache hit ratio h, m output tokens) and occupancy i = 1..B: the chunk count c(i)
(model/queueing/chunks.py), the prefill work W_pref(c) = beta n_c + gamma n_c (c + 1) / 2 +
gamma c (n - n_c) (each chunk also reads the cached prefix), the decode work
W_dec = beta m + gamma m (n + (m + 1) / 2), tau(i) = (c + m) alpha + i (W_pref + W_dec), the
departure rate mu_i = i / tau(i) and its logs.

The refined variant adds prefill attention over the n^2 / 2 causal (query, key) pairs,
beta kappa E[n^2] (1 - h^2) / 2 (kappa from the architecture; with a cached prefix only the
uncached queries attend), and the spread of the output length in the KV reads,
gamma m^2 cv_m^2 / 2, with E[n^2] = n^2 (1 + cv_n^2) and E[m^2] = m^2 (1 + cv_m^2): the decode
term is then the mean KV context of a running request, n + E[m^2] / (2 E[m]) (a longer output
stays in the batch longer, so the context decoding requests hold is length-biased).

Packed for the compiled loops: `states[row, field, col]` with column i - 1 for occupancy i
(CUM_LOG_MU: column i for i = 0..B), and `rows[row, field]` for the per-row scalars.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from model.queueing.kernel.jit import compiled

FloatArray = NDArray[np.float64]

# Fields of `states` (rows, STATE_FIELDS, B + 1). MAX_MU: max_{j<=i} mu_j; MIN_LOG_MU:
# min_{j>=i} log mu_j (they bound where the chain's weights can still rise).
CHUNKS, W_PREF, TAU, LOG_MU, CUM_LOG_MU, MU, INV_MU, MAX_MU, MIN_LOG_MU = range(9)
STATE_FIELDS = 9
# Fields of `rows` (rows, ROW_FIELDS).
ALPHA, W_DEC, OUTPUT, PREFILL_TOKENS = range(4)
ROW_FIELDS = 4


@compiled
def chunk_threshold(c: float, n: float, m: float, budget: float) -> float:
    """thr(c) = floor(max(0, (c + m)(M - n/c) / (n + m))): the largest batch whose mean token
    load plus one more n/c chunk fits the budget M."""
    return float(np.floor(max(0.0, (c + m) * (budget - n / c) / (n + m))))


@compiled
def chunk_count(c: float, i: float, n: float, m: float, budget: float) -> float:
    """c(i) = min {c' >= c : thr(c') >= i} for a prompt of n computed tokens and m outputs,
    from a lower bound c >= 1: with c = c(i - 1) (c(i) is non-decreasing in i, thr strictly
    increasing in c), this is c(i) = min {c >= 1 : thr(c) >= i} in amortised one step."""
    while chunk_threshold(c, n, m, budget) < i:
        c = c + 1.0
    return c


@compiled
def fill_chunks(n: FloatArray, m: FloatArray, budget: float, big_b: int, out: FloatArray) -> None:
    """out[row, i - 1] = c(i) for i = 1..B per request shape (n, m)."""
    for k in range(n.shape[0]):
        c = 1.0
        for i in range(1, big_b + 1):
            c = chunk_count(c, float(i), n[k], m[k], budget)
            out[k, i - 1] = c


@compiled
def occupancy_logs(big_b: int) -> FloatArray:
    """log(i) for i = 1..B (column i - 1), shared by every row of a table."""
    out: FloatArray = np.log(np.arange(1.0, big_b + 1.0))
    return out


@compiled
def build_states(
    n: FloatArray,
    m: FloatArray,
    alpha: float,
    beta: float,
    gamma: float,
    budget: float,
    work: FloatArray,
    log_occ: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """The packed table for rows (n, m) (arrays of one length) under parameters (ms);
    B = len(log_occ) (`occupancy_logs`).

    `work` = [refined (0/1), prefix hit ratio h, h^2, kappa, cv_n^2, cv_m^2] (the paper variant
    passes h = 0 and no extra terms)."""
    count, big_b = n.shape[0], log_occ.shape[0]
    states = np.empty((count, STATE_FIELDS, big_b + 1))
    rows = np.empty((count, ROW_FIELDS))
    for k in range(count):
        fill_row(states, rows, k, n[k], m[k], alpha, beta, gamma, budget, work, log_occ)
    return states, rows


@compiled
def fill_row(
    states: FloatArray, rows: FloatArray, k: int, nk: float, mk: float, a: float, b: float,
    g: float, budget: float, work: FloatArray, log_occ: FloatArray,
) -> None:
    """Row k of the packed table (build_states) for one request shape (n, m) and parameters
    (ms); the same numbers whichever row and table it fills."""
    big_b = log_occ.shape[0]
    refined, hit, hit2, kappa = work[0] > 0.0, work[1], work[2], work[3]
    cv2n, cv2m = work[4], work[5]
    states[k, :, big_b] = 0.0  # column B is CUM_LOG_MU's only
    states[k, CUM_LOG_MU, 0] = 0.0
    n_comp = nk * (1.0 - hit)
    w_dec = b * mk + g * mk * (nk + (mk + 1.0) / 2.0)
    attention = 0.0
    if refined:
        # The refined terms (module docstring).
        attention = b * kappa * nk * nk * (1.0 + cv2n) * (1.0 - hit2) / 2.0
        w_dec = w_dec + g * mk * mk * cv2m / 2.0
    # c(i) steps only where thr(c) < i: the threshold of the current c is kept, and the terms
    # of c alone are computed where it steps, not per state (the same operations, so the same
    # numbers). thr = -1 makes state 1 compute those of c(1).
    c, thr = 1.0, -1.0
    cum, top_mu, w_pref, w_total, fixed = 0.0, 0.0, 0.0, 0.0, 0.0
    for i in range(1, big_b + 1):
        occ = float(i)
        if thr < occ:
            c = chunk_count(c, occ, n_comp, mk, budget)
            thr = chunk_threshold(c, n_comp, mk, budget)
            w_pref = b * n_comp + g * n_comp * (c + 1.0) / 2.0 + g * c * (nk - n_comp)
            if refined:
                w_pref = w_pref + attention
            w_total = w_pref + w_dec
            fixed = (c + mk) * a
        tau = fixed + occ * w_total
        log_mu = log_occ[i - 1] - math.log(tau)
        cum = cum + log_mu  # np.cumsum's order
        col = i - 1
        states[k, CHUNKS, col] = c
        states[k, W_PREF, col] = w_pref
        states[k, TAU, col] = tau
        states[k, LOG_MU, col] = log_mu
        states[k, CUM_LOG_MU, i] = cum
        states[k, MU, col] = occ / tau
        states[k, INV_MU, col] = tau / occ
        top_mu = max(top_mu, occ / tau)
        states[k, MAX_MU, col] = top_mu
    low = np.inf
    for col in range(big_b - 1, -1, -1):
        low = min(low, states[k, LOG_MU, col])
        states[k, MIN_LOG_MU, col] = low
    rows[k, ALPHA] = a
    rows[k, W_DEC] = w_dec
    rows[k, OUTPUT] = mk
    rows[k, PREFILL_TOKENS] = n_comp
