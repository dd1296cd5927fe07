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

A table shared by many rates (`build_states`) is filled whole. A row built for one rate (a
one-shot `analyze`, a refit's point) is filled lazily (`fill_row(..., lazy=True)`): everything
but the logs, which take most of a row's time, and `ensure_logs` adds LOG_MU and CUM_LOG_MU up
to the highest state the chain's solve reads (with its early exit, often far below B). The
solve also needs sum_{j<=B} log mu_j for the weight of state B, p_B: every row holds it summed
as the logs of running products of mu_j (one log per ~70 states; within a few ulps a state of
the sum of the logs, so p_B within 1e-12 relative of the one from CUM_LOG_MU[B] at B = 4096).
Every other number is the same operation for operation in a lazy and a whole row, so both give
the same outputs, bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from model.queueing.kernel.jit import compiled

FloatArray = NDArray[np.float64]

# Fields of `states` (rows, STATE_FIELDS, B + 1). MAX_MU: max_{j<=i} mu_j; MIN_MU:
# min_{j>=i} mu_j (they bound where the chain's weights can still rise).
CHUNKS, W_PREF, TAU, LOG_MU, CUM_LOG_MU, MU, MAX_MU, MIN_MU, INV_MU = range(9)
STATE_FIELDS = 9
# INV_MU: 1 / mu_i = tau(i) / i, in whole rows only (a lazy row's solve divides where it needs
# it: the same number).
# Fields of `rows` (rows, ROW_FIELDS). LOGGED: LOG_MU and CUM_LOG_MU hold states 1..LOGGED;
# LOG_MU_B: log mu_B; CUM_LOG_MU_B: sum_{j<=B} log mu_j (from products); WHOLE: 1 for a whole
# row (INV_MU filled), 0 for a lazy one.
ALPHA, W_DEC, OUTPUT, PREFILL_TOKENS, LOGGED, LOG_MU_B, CUM_LOG_MU_B, WHOLE = range(8)
ROW_FIELDS = 8
# A lazy row's running product of mu_j is logged and restarted once it leaves
# [2^-PRODUCT_EXPONENT, 2^PRODUCT_EXPONENT]: far from overflow whatever mu_j comes next.
PRODUCT_EXPONENT = 500


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
    """The packed table for rows (n, m) (arrays of one length) under parameters (ms), filled
    whole; B = len(log_occ) (`occupancy_logs`).

    `work` = [refined (0/1), prefix hit ratio h, h^2, kappa, cv_n^2, cv_m^2] (the paper variant
    passes h = 0 and no extra terms)."""
    count, big_b = n.shape[0], log_occ.shape[0]
    states = np.empty((count, STATE_FIELDS, big_b + 1))
    rows = np.empty((count, ROW_FIELDS))
    for k in range(count):
        fill_row(states, rows, k, n[k], m[k], alpha, beta, gamma, budget, work, log_occ, False)
    return states, rows


@compiled
def fill_row(
    states: FloatArray, rows: FloatArray, k: int, nk: float, mk: float, a: float, b: float,
    g: float, budget: float, work: FloatArray, log_occ: FloatArray, lazy: bool,
) -> None:
    """Row k of the packed table (build_states) for one request shape (n, m) and parameters
    (ms); the same numbers whichever row and table it fills. Lazy: without the logs
    (module docstring; `ensure_logs` adds them)."""
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
    # sum_{j<=B} log mu_j for p_B: running products of mu_j, logged once out of range.
    high, low = 2.0**PRODUCT_EXPONENT, 2.0**-PRODUCT_EXPONENT
    product, products = 1.0, 0.0
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
        col = i - 1
        mu = occ / tau
        if not lazy:
            log_mu = log_occ[col] - math.log(tau)
            cum = cum + log_mu  # np.cumsum's order
            states[k, LOG_MU, col] = log_mu
            states[k, CUM_LOG_MU, i] = cum
            states[k, INV_MU, col] = tau / occ
        product = product * mu
        if not low < product < high:  # also a 0, inf or nan product: its log is the sum's
            products = products + math.log(product)
            product = 1.0
        states[k, CHUNKS, col] = c
        states[k, W_PREF, col] = w_pref
        states[k, TAU, col] = tau
        states[k, MU, col] = mu
        top_mu = max(top_mu, mu)
        states[k, MAX_MU, col] = top_mu
    least = np.inf
    for col in range(big_b - 1, -1, -1):
        least = min(least, states[k, MU, col])
        states[k, MIN_MU, col] = least
    rows[k, ALPHA] = a
    rows[k, W_DEC] = w_dec
    rows[k, OUTPUT] = mk
    rows[k, PREFILL_TOKENS] = n_comp
    rows[k, LOGGED] = 0.0 if lazy else float(big_b)
    rows[k, WHOLE] = 0.0 if lazy else 1.0
    rows[k, LOG_MU_B] = log_occ[big_b - 1] - math.log(states[k, TAU, big_b - 1])
    rows[k, CUM_LOG_MU_B] = products + math.log(product)


@compiled
def ensure_logs(states: FloatArray, rows: FloatArray, k: int, upto: int) -> None:
    """LOG_MU and CUM_LOG_MU of row k up to state `upto` (those of a lazy row are added from
    the highest held; a whole row holds them all): the numbers of a whole row."""
    done = int(rows[k, LOGGED])
    if done >= upto:
        return
    cum = states[k, CUM_LOG_MU, done]
    for i in range(done + 1, upto + 1):
        col = i - 1
        log_mu = math.log(float(i)) - math.log(states[k, TAU, col])
        cum = cum + log_mu
        states[k, LOG_MU, col] = log_mu
        states[k, CUM_LOG_MU, i] = cum
    rows[k, LOGGED] = float(upto)
