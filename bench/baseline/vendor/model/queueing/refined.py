"""Refined ("B5") latency assembly at the level of single engine iterations. Refinements §6.

Same alpha, beta, gamma, chunk table and birth-death chain as the paper (spec §2-5), so X-bar,
S-bar, W and the saturation rate keep their meaning. Four things change:

* Work terms (model/queueing/work.py, used by the chain): prefill attention over n^2/2 causal pairs,
  beta kappa E[n^2] / 2 with kappa from the architecture, the second moments
  E[n^2] = n^2 (1 + cv_n^2), E[m^2] = m^2 (1 + cv_m^2) of the request lengths, and prefix-cache
  hits (only uncached prompt tokens computed; chain.py).
* What an arrival sees: Poisson arrivals see the time average (PASTA: X_o = X-bar, busy with
  probability 1 - p0); constant-rate arrivals spaced 1/lambda apart see the earlier arrivals
  whose time in service S_r ~ U[S/2, 3S/2] has not yet run out. The two views are mixed
  linearly in the squared arrival CV (capped at the Poisson view).
* Bursts (arrival CV > 1, `burst_waits`): the slot wait W is scaled by (ca2 + 1) / 2 and the
  prefill-work queue (prefill_queue.py, shared with the percentile model) adds its wait beyond
  the Poisson one, E[W](ca2) - E[W](1); at or below Poisson neither changes anything.
* TTFT = W + R + C + B + T_p + (L_d + d), with B the burst term and d = W_dec / m: the focal
  prefill iteration holds the others' decodes (L_d = alpha + X_o d), not a share of their
  prefills, so T_p = c_f L_d + W_pref(c_f) with c_f = c(round(X_o + 1)); R waits for the
  iteration in progress (Allen-Cunneen scaled); C covers arrivals joining the same prefill step;
  the first token is one decode iteration. ITL = (S-bar - T_p) / m as in the paper (total service
  conserved), floored at alpha + d.

A synchronous benchmark run (concurrency one, closed) has no chain: T_p = c(1) alpha +
W_pref(c(1)), ITL = alpha + d, TTFT = T_p + alpha + d.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from bench.baseline.vendor.model.queueing.chain import ChainSolution, StateTable
from bench.baseline.vendor.model.queueing.prefill_queue import prefill_work_queue, prompt_service_ms

FloatArray = NDArray[np.float64]

# 1 - lambda W_pref is the share of time not spent on arriving prefills; near overload of a
# finite chain it can reach 0, where the collision terms are capped instead of dividing by 0.
_MIN_FREE_SHARE = 1e-9


def seen_at_constant_rate(service_ms: FloatArray, rate_per_ms: FloatArray) -> FloatArray:
    """Mean number of earlier requests still in service when arrivals come exactly 1/lambda
    apart and time in service is U[S/2, 3S/2]: sum_{k>=1} P(S_r > k/lambda) in closed form."""
    a = service_ms / 2.0
    x1 = a * rate_per_ms  # S/2 in units of the arrival spacing
    k1 = np.maximum(np.ceil(x1) - 1.0, 0.0)  # k with k/lambda < S/2: certainly still present
    k2 = np.maximum(np.ceil(3.0 * x1) - 1.0, 0.0)  # k with k/lambda < 3S/2: possibly present
    # On the ramp P(S_r > t) = (3a - t)/(2a) with t = k/lambda; summed over k1 < k <= k2.
    pairs = k2 * (k2 + 1.0) - k1 * (k1 + 1.0)
    safe_x1 = np.where(x1 > 0.0, x1, 1.0)
    ramp = 1.5 * (k2 - k1) - pairs / (4.0 * safe_x1)
    return np.where(x1 > 0.0, k1 + ramp, 0.0)


def busy_at_constant_rate(service_ms: FloatArray, rate_per_ms: FloatArray) -> FloatArray:
    """P(S_r > 1/lambda): the previous arrival is still in service (engine busy)."""
    x1 = service_ms / 2.0 * rate_per_ms
    safe_x1 = np.where(x1 > 0.0, x1, 1.0)
    return np.where(x1 > 0.0, np.clip((3.0 * x1 - 1.0) / (2.0 * safe_x1), 0.0, 1.0), 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class RefinedLatencies:
    """Per-rate latencies of the refined assembly (ms) and the focal prefill's chunk count."""

    ttft_ms: FloatArray
    itl_ms: FloatArray
    prefill_ms: FloatArray
    chunks: NDArray[np.int64]


def burst_waits(
    table: StateTable,
    rate_per_ms: FloatArray,
    wait_ms: FloatArray,
    w_pref: FloatArray,
    decode_iter: FloatArray,
    seen: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """The slot wait and the extra prefill-work wait (ms) under arrivals burstier than Poisson.

    The chain's slot wait W is that of exponential service times, so the GI/G/B (Allen-Cunneen)
    wait is W (ca2 + 1) / 2. The residual and collision terms are the prefill-work queue for
    Poisson arrivals; bursts add Kingman's excess over Poisson, rho / (1 - rho) (ca2 - 1) / 2 E[S],
    of the queue of prompt work S (percentiles §3, prefill_queue.py): +inf once rho >= 1.
    Only ca2 > 1 changes anything: smoother arrivals have their own view (seen_at_constant_rate).
    """
    opts = table.options
    ca2 = opts.arrival_cv**2
    if ca2 <= 1.0:
        return wait_ms, np.zeros_like(wait_ms)
    per_row = table.rows > 1
    n_c = table.prefill_tokens[:, 0] if per_row else table.prefill_tokens[0, 0]
    service = prompt_service_ms(w_pref, n_c, decode_iter, seen, table.budget_tokens)
    cs2 = np.full_like(service, opts.input_length_cv**2)
    bursty = prefill_work_queue(rate_per_ms, service, cs2, ca2)
    poisson = prefill_work_queue(rate_per_ms, service, cs2, 1.0)
    stable = bursty.stable
    excess = np.where(stable, bursty.mean_ms - np.where(stable, poisson.mean_ms, 0.0), np.inf)
    return wait_ms * (ca2 + 1.0) / 2.0, excess


def refined_latencies(
    table: StateTable,
    sol: ChainSolution,
    rate_per_ms: FloatArray,
    accepted_per_ms: FloatArray,
    service_ms: FloatArray,
    wait_ms: FloatArray,
    synchronous: NDArray[np.bool_],
) -> RefinedLatencies:
    """TTFT, ITL and prefill time (ms) per rate from the solved chain. Refinements §6."""
    opts = table.options
    ca2 = opts.arrival_cv**2
    cv2n = opts.input_length_cv**2
    alpha = table.alpha_ms
    big_b = table.max_batch_size
    per_row = table.rows > 1
    m = table.avg_output_tokens[:, 0] if per_row else table.avg_output_tokens[0, 0]
    w_dec = table.w_dec_ms[:, 0] if per_row else table.w_dec_ms[0, 0]
    d = w_dec / m  # one decoding request's work per iteration

    # What an arrival sees: others present and whether an iteration is in progress.
    poisson_share = min(ca2, 1.0)
    seen = sol.batch_occupancy
    busy = 1.0 - sol.p_empty
    if poisson_share < 1.0:  # Poisson arrivals (the default) need no constant-rate view
        seen_const = seen_at_constant_rate(service_ms, rate_per_ms)
        busy_const = busy_at_constant_rate(service_ms, rate_per_ms)
        seen = poisson_share * seen + (1.0 - poisson_share) * seen_const
        busy = poisson_share * busy + (1.0 - poisson_share) * busy_const

    col = np.clip(np.floor(seen + 1.5), 1, big_b).astype(np.intp) - 1  # round(X_o + 1)
    chunk_count = table.take(table.chunks, col)
    chunks = chunk_count.astype(np.float64)
    w_pref = table.take(table.w_pref_ms, col)
    decode_iter = alpha + seen * d  # L_d: an iteration of the others, all decoding
    prefill = chunks * decode_iter + w_pref

    # Residual of the iteration in progress: iterations of length L_d plus Poisson-many
    # prefill chunks of w each (length-biased), scaled by Allen-Cunneen for the arrival CV.
    chunk_work = w_pref / chunks
    free = np.maximum(1.0 - accepted_per_ms * w_pref, _MIN_FREE_SHARE)
    chunks_per_iter = accepted_per_ms * chunks * decode_iter / free
    mean_iter = decode_iter + chunk_work * chunks_per_iter
    second = (
        decode_iter**2
        + 2.0 * decode_iter * chunk_work * chunks_per_iter
        + chunk_work**2 * (1.0 + cv2n) * (chunks_per_iter + chunks_per_iter**2)
    )
    residual_poisson = second / (2.0 * mean_iter)
    # Allen-Cunneen: f = (ca2 + cs2) / (1 + cs2), 1 for Poisson arrivals.
    cs2 = cv2n * (chunk_work / (decode_iter + chunk_work)) ** 2
    ac_factor = (ca2 + cs2) / (1.0 + cs2)
    residual = busy * (
        0.5 * decode_iter + ac_factor * np.maximum(0.0, residual_poisson - 0.5 * decode_iter)
    )
    collision = ac_factor * busy * accepted_per_ms * residual_poisson * chunk_work

    # The arrival-seen prefill can exceed the time-average service time when outputs are a
    # token or two long; no decode step is shorter than one iteration of the request alone.
    itl = np.maximum((service_ms - prefill) / m, alpha + d)
    wait_ms, burst = burst_waits(table, rate_per_ms, wait_ms, w_pref, decode_iter, seen)
    ttft = wait_ms + residual + collision + burst + prefill + (decode_iter + d)

    if synchronous.any():
        # Closed run at concurrency one: the engine is idle at every arrival.
        c1 = table.chunks[:, 0] if per_row else table.chunks[0, 0]
        w1 = table.w_pref_ms[:, 0] if per_row else table.w_pref_ms[0, 0]
        prefill_1 = c1 * alpha + w1
        itl_1 = alpha + d
        prefill = np.where(synchronous, prefill_1, prefill)
        itl = np.where(synchronous, itl_1, itl)
        ttft = np.where(synchronous, prefill_1 + alpha + d, ttft)
        chunk_count = np.where(synchronous, c1, chunk_count)
    return RefinedLatencies(ttft_ms=ttft, itl_ms=itl, prefill_ms=prefill, chunks=chunk_count)
