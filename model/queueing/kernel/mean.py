"""Compiled mean-latency assembly at one rate: the paper's (spec §6) and the refined one
(refinements §6; the formulas are documented in model/queueing/analyzer.py and refined.py).

`evaluate` fills one column of FIELDS outputs per rate from the packed state table
(kernel/table.py) and the chain (kernel/chain.py), and optionally the chain's occupancy
distribution per rate, which the percentile assembly builds on in numpy.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from model.queueing.kernel import chain as chain
from model.queueing.kernel import table as kernel_table
from model.queueing.kernel.arrivals import (
    busy_at_constant_rate,
    prefill_wait,
    seen_at_constant_rate,
)
from model.queueing.kernel.jit import compiled
from model.queueing.kernel.table import (
    ALPHA,
    CHUNKS,
    OUTPUT,
    PREFILL_TOKENS,
    TAU,
    W_DEC,
    W_PREF,
)

FloatArray = NDArray[np.float64]

# Outputs per rate (rows of `evaluate`'s result), in Analysis's field order after the rate.
# TTFT_CHUNK is TTFT without the first-token iteration (percentiles.FirstToken.WITH_LAST_CHUNK).
(STABLE, THROUGHPUT, TTFT, ITL, WAIT, PREFILL, SERVICE, RESPONSE, NUM, BATCH, QUEUE, UTIL,
 BUSY, WAIT_PROB, BLOCK, CHUNK_COUNT, MAX_RATE, SATURATION, TTFT_CHUNK) = range(19)  # fmt: skip
FIELDS = 19
MAX_RATE_FRACTION = 0.999  # MaxRate = 0.999 B / tau(B) (Go `RateRange.Max`). Spec §7.
# 1 - lambda W_pref is the share of time not spent on arriving prefills; near overload of a
# finite chain it can reach 0, where the collision terms are capped instead of dividing by 0.
_MIN_FREE_SHARE = 1e-9
# `options` vector: [refined (0/1), arrival CV^2, prompt-length CV^2, budget M, max queue
# (-1: infinite)].
OPT_REFINED, OPT_CA2, OPT_CV2N, OPT_BUDGET, OPT_QUEUE = range(5)


@compiled
def _expected_min(mean_count: float, cap: float) -> float:
    """E[min(K, cap)] for K ~ Poisson(mean_count) and cap >= 0 (+inf: no cap): the prompts of
    a Poisson count that a budget holding `cap` of them admits."""
    if not mean_count > 0.0:
        return 0.0
    if cap > mean_count + 12.0 * np.sqrt(mean_count) + 12.0:
        return mean_count  # the cap is out of reach
    log_mean = np.log(mean_count)
    log_p = -mean_count  # log P(K = k), from k = 0 (no underflow of exp(-mean) itself)
    below, total = 0.0, 0.0  # E[K; K <= cap], P(K <= cap)
    k = 0.0
    while k <= cap:
        p = np.exp(log_p)
        below += k * p
        total += p
        k += 1.0
        log_p += log_mean - np.log(k)
    return below + cap * max(1.0 - total, 0.0)


@compiled
def _refined(
    states: FloatArray, rows: FloatArray, row: int, big_b: int, opts: FloatArray,
    lam: float, accepted: float, service: float, wait: float, occ: float, p_empty: float,
    out: FloatArray,
) -> None:
    ca2, cv2n = opts[OPT_CA2], opts[OPT_CV2N]
    alpha, m = rows[row, ALPHA], rows[row, OUTPUT]
    d = rows[row, W_DEC] / m  # one decoding request's work per iteration
    # What an arrival sees: others present and whether an iteration is in progress.
    share = min(ca2, 1.0)
    seen, busy = occ, 1.0 - p_empty
    if share < 1.0:
        seen = share * seen + (1.0 - share) * seen_at_constant_rate(service, lam)
        busy = share * busy + (1.0 - share) * busy_at_constant_rate(service, lam)
    col = int(min(max(np.floor(seen + 1.5), 1.0), float(big_b))) - 1  # round(X_o + 1)
    chunks = states[row, CHUNKS, col]
    w_pref = states[row, W_PREF, col]
    decode_iter = alpha + seen * d  # L_d
    prefill = chunks * decode_iter + w_pref
    chunk_work = w_pref / chunks
    free = max(1.0 - accepted * w_pref, _MIN_FREE_SHARE)
    per_iter = accepted * chunks * decode_iter / free
    mean_iter = decode_iter + chunk_work * per_iter
    second = (
        decode_iter * decode_iter
        + 2.0 * decode_iter * chunk_work * per_iter
        + chunk_work * chunk_work * (1.0 + cv2n) * (per_iter + per_iter * per_iter)
    )
    residual_poisson = second / (2.0 * mean_iter)
    ratio = chunk_work / (decode_iter + chunk_work)
    cs2 = cv2n * (ratio * ratio)
    ac_factor = (ca2 + cs2) / (1.0 + cs2)  # Allen-Cunneen
    residual = busy * 0.5 * decode_iter
    # Prefill work ahead: the rest of the iteration in progress beyond its decode part, and the
    # prompts that arrived during its elapsed part (C, admitted first into the same step); or
    # the prefill-work queue's wait (percentiles §3) once prompts back up beyond that step.
    ahead = ac_factor * busy * (
        max(0.0, residual_poisson - 0.5 * decode_iter) + accepted * residual_poisson * chunk_work
    )
    n_bar = rows[row, PREFILL_TOKENS]
    room = max(opts[OPT_BUDGET] - seen, 1.0)
    work = w_pref + decode_iter * n_bar / room
    # Prompt work cannot load the engine more than all its work does (the chain's lambda / mu_B,
    # below 1 up to MaxRate): the two views part where prompts are chunked in a tiny budget.
    load = lam * states[row, TAU, big_b - 1] / big_b
    delay, tail = prefill_wait(min(lam, load / work), work, cv2n, min(ca2, 1.0))
    queued = delay * tail
    # Prompts arriving during the rest of it join the request's own step while the budget left
    # after it and the prompts ahead holds them (a count of mean-size prompts, Poisson).
    joining = ac_factor * accepted * residual_poisson
    fit = max(room / n_bar - 1.0 - joining, 0.0) if n_bar > 0.0 else np.inf
    joined = busy * w_pref * _expected_min(joining, fit)
    itl = max((service - prefill) / m, alpha + d)
    burst = 0.0
    if ca2 > 1.0:
        # Bursts: the slot wait of GI/G/B and the prefill-work queue's excess over Poisson.
        burst = np.inf
        if lam * work < 1.0:
            bursty, poisson = prefill_wait(lam, work, cv2n, ca2), prefill_wait(lam, work, cv2n, 1.0)
            burst = bursty[0] * bursty[1] - poisson[0] * poisson[1]
        wait = wait * (ca2 + 1.0) / 2.0
    # The first token leaves one decode iteration after the last chunk (the fitted convention).
    out[TTFT_CHUNK] = wait + residual + max(ahead, queued) + joined + burst + prefill
    out[TTFT] = out[TTFT_CHUNK] + (decode_iter + d)
    out[ITL], out[PREFILL], out[CHUNK_COUNT] = itl, prefill, chunks


@compiled
def rate_outputs(
    states: FloatArray, rows: FloatArray, row: int, big_b: int, opts: FloatArray,
    rate_rps: float, synchronous: bool, log_p: FloatArray, w: FloatArray, sol: FloatArray,
    out: FloatArray,
) -> tuple[int, int]:
    """Every output at one rate (req/s) into out[0..FIELDS); the chain into sol and w (the
    range of states `chain.solve` filled is returned)."""
    lam = rate_rps / 1000.0
    max_queue = int(opts[OPT_QUEUE])
    filled = chain.solve(states, rows, row, big_b, max_queue, lam, log_p, w, sol)
    stable = sol[chain.STABLE] > 0.0
    tau_1, tau_b = states[row, TAU, 0], states[row, TAU, big_b - 1]
    sat = big_b / tau_b
    occ = sol[chain.OCC]
    accepted = lam * (1.0 - sol[chain.P_BLOCK]) if stable else sat
    # At rate 0 Little's ratios are 0/0; use their limits: S-bar = R = tau(1), W = 0 (spec §6).
    positive = accepted > 0.0
    service = occ / accepted if positive else tau_1
    response = sol[chain.NUM] / accepted if positive else tau_1
    wait = sol[chain.QUEUE] / accepted if positive else 0.0
    if synchronous and opts[OPT_REFINED] > 0.0:
        # Closed run at concurrency one: the engine is idle at every arrival.
        alpha, d = rows[row, ALPHA], rows[row, W_DEC] / rows[row, OUTPUT]
        prefill_1 = states[row, CHUNKS, 0] * alpha + states[row, W_PREF, 0]
        out[TTFT], out[ITL], out[TTFT_CHUNK] = prefill_1 + alpha + d, alpha + d, prefill_1
        out[PREFILL], out[CHUNK_COUNT] = prefill_1, states[row, CHUNKS, 0]
    elif opts[OPT_REFINED] > 0.0:
        _refined(states, rows, row, big_b, opts, lam, accepted, service, wait, occ,
                 sol[chain.P_EMPTY], out)  # fmt: skip
    else:
        col = int(min(max(np.floor(occ + 0.5), 1.0), float(big_b))) - 1
        chunks = states[row, CHUNKS, col]
        # delta(c) = (W_pref + W_dec) / (c + m): mean work per iteration of one request.
        delta = (states[row, W_PREF, col] + rows[row, W_DEC]) / (chunks + rows[row, OUTPUT])
        background = max(0.0, rows[row, ALPHA] + (occ - 1.0) * delta)
        prefill = chunks * background + states[row, W_PREF, col]
        itl = (service - prefill) / rows[row, OUTPUT]
        out[TTFT_CHUNK] = wait + prefill
        out[TTFT], out[ITL] = out[TTFT_CHUNK] + itl, itl
        out[PREFILL], out[CHUNK_COUNT] = prefill, chunks
    out[STABLE] = 1.0 if stable else 0.0
    out[THROUGHPUT] = accepted * 1000.0
    out[WAIT], out[SERVICE], out[RESPONSE] = wait, service, response
    out[NUM], out[BATCH], out[QUEUE] = sol[chain.NUM], occ, sol[chain.QUEUE]
    out[UTIL] = min(occ / big_b, 1.0)
    out[BUSY] = 1.0 - sol[chain.P_EMPTY]
    out[WAIT_PROB], out[BLOCK] = sol[chain.P_WAIT], sol[chain.P_BLOCK]
    out[MAX_RATE] = sat * (MAX_RATE_FRACTION * 1000.0)
    out[SATURATION] = sat * 1000.0
    if not stable:  # means that grow without bound
        for k in (TTFT, TTFT_CHUNK, ITL, WAIT, PREFILL, RESPONSE, NUM, QUEUE):
            out[k] = np.inf
        out[SERVICE] = tau_b
    return filled


@compiled
def evaluate(
    states: FloatArray, rows: FloatArray, opts: FloatArray, rates_rps: FloatArray,
    synchronous: NDArray[np.bool_], want_pmf: bool,
) -> tuple[FloatArray, FloatArray]:
    """Outputs (FIELDS, rates) at each rate (req/s; its own table row unless the table has
    one), and the chain's occupancy pmf (rates, B + 1) when asked (else shape (0, B + 1))."""
    big_b = states.shape[2] - 1
    count = rates_rps.shape[0]
    out = np.empty((FIELDS, count))
    pmf = np.empty((count if want_pmf else 0, big_b + 1))
    log_p, w = np.empty(big_b + 1), np.empty(big_b + 1)
    sol, col = np.empty(chain.CHAIN_FIELDS), np.empty(FIELDS)
    per_row = states.shape[0] > 1
    for j in range(count):
        row = j if per_row else 0
        filled = rate_outputs(states, rows, row, big_b, opts, rates_rps[j], synchronous[j],
                              log_p, w, sol, col)  # fmt: skip
        out[:, j] = col
        if want_pmf:
            stable = sol[chain.STABLE] > 0.0
            chain.pmf(big_b, int(opts[OPT_QUEUE]), sol[chain.LOG_R], w, filled, stable, pmf[j])
    return out, pmf


@compiled
def analyze_one(
    n: float, m: float, alpha: float, beta: float, gamma: float, work: FloatArray,
    opts: FloatArray, log_occ: FloatArray, rate_rps: float,
) -> FloatArray:
    """Every output at one rate (req/s) for one request shape and parameters (ms): the table
    row and the chain in one call (the one-shot `analyze`); B = len(log_occ)."""
    out = point_outputs(
        np.array([n]), np.array([m]), np.array([rate_rps]), np.zeros(1, np.bool_),
        np.array([[alpha, beta, gamma]]), work, opts, log_occ,
    )  # fmt: skip
    return out[:, 0]


@compiled
def point_outputs(
    n: FloatArray, m: FloatArray, rates_rps: FloatArray, synchronous: NDArray[np.bool_],
    theta: FloatArray, work: FloatArray, opts: FloatArray, log_occ: FloatArray,
) -> FloatArray:
    """Every output (FIELDS, P x K; column p K + k) of K points (request shape, rate) under
    each of P parameter vectors theta[p] = (alpha, beta, gamma) (ms); B = len(log_occ).

    Each point's table row is built lazily (kernel/table.py), evaluated and overwritten by the
    next: the memory is one row whatever P x K (a table of every row was 295 KB per point at
    B = 4096). A point of the shape and parameters of the one before reuses its row, with
    the logs that one computed (the same numbers: a row's logs are filled in one order)."""
    big_b = log_occ.shape[0]
    count, points = theta.shape[0], n.shape[0]
    out = np.empty((FIELDS, count * points))
    states = np.empty((1, kernel_table.STATE_FIELDS, big_b + 1))
    rows = np.empty((1, kernel_table.ROW_FIELDS))
    log_p, w = np.empty(big_b + 1), np.empty(big_b + 1)
    sol, col = np.empty(chain.CHAIN_FIELDS), np.empty(FIELDS)
    for p in range(count):
        alpha, beta, gamma = theta[p, 0], theta[p, 1], theta[p, 2]
        for k in range(points):
            if k == 0 or n[k] != n[k - 1] or m[k] != m[k - 1]:
                kernel_table.fill_row(states, rows, 0, n[k], m[k], alpha, beta, gamma,
                                      opts[OPT_BUDGET], work, log_occ, True)  # fmt: skip
            rate_outputs(states, rows, 0, big_b, opts, rates_rps[k], synchronous[k],
                         log_p, w, sol, col)  # fmt: skip
            out[:, p * points + k] = col
    return out


@compiled
def point_residuals(
    n: FloatArray, m: FloatArray, rates_rps: FloatArray, synchronous: NDArray[np.bool_],
    theta: FloatArray, work: FloatArray, opts: FloatArray, log_occ: FloatArray,
    ttft_ms: FloatArray, itl_ms: FloatArray, sqrt_weight: FloatArray, first_metric: int,
    penalty_per_load: float,
) -> tuple[FloatArray, FloatArray]:
    """A fit's weighted relative residuals of K points under each of P parameter vectors
    (`point_outputs`), in one call: row p holds (pred - meas) / meas x sqrt(weight) of the
    TTFTs (from first_metric 0; 1 leaves them out), then of the ITLs; where that is not
    finite (an overloaded point), penalty_per_load x rate / saturation rate instead. Also the
    predictions (TTFT, ITL, saturation rate) as (3, P, K). The same operations as the numpy
    assembly in model/calibration/residuals.py, element by element."""
    count, points = theta.shape[0], n.shape[0]
    out = point_outputs(n, m, rates_rps, synchronous, theta, work, opts, log_occ)
    metrics = 2 - first_metric
    residuals = np.empty((count, metrics * points))
    predicted = np.empty((3, count, points))
    for p in range(count):
        for k in range(points):
            ttft, itl = out[TTFT, p * points + k], out[ITL, p * points + k]
            saturation = out[SATURATION, p * points + k]
            predicted[0, p, k], predicted[1, p, k], predicted[2, p, k] = ttft, itl, saturation
            penalty = penalty_per_load * (rates_rps[k] / saturation)
            ttft_error = (ttft - ttft_ms[k]) / ttft_ms[k]
            itl_error = (itl - itl_ms[k]) / itl_ms[k]
            if not np.isfinite(ttft_error):
                ttft_error = penalty
            if not np.isfinite(itl_error):
                itl_error = penalty
            if first_metric == 0:
                residuals[p, k] = ttft_error * sqrt_weight[k]
            residuals[p, (1 - first_metric) * points + k] = itl_error * sqrt_weight[k]
    return residuals, predicted
