"""Refined ("B5") latency assembly at the level of single engine iterations. Refinements §6.

Same alpha, beta, gamma, chunk table and birth-death chain as the paper (spec §2-5), so X-bar,
S-bar, W and the saturation rate keep their meaning. Four things change:

* Work terms (model/queueing/kernel/table.py, used by the chain): prefill attention over n^2/2
  causal pairs, beta kappa E[n^2] / 2 with kappa from the architecture, the second moments
  E[n^2] = n^2 (1 + cv_n^2), E[m^2] = m^2 (1 + cv_m^2) of the request lengths, and prefix-cache
  hits (only uncached prompt tokens computed; chain.py).
* What an arrival sees: Poisson arrivals see the time average (PASTA: X_o = X-bar, busy with
  probability 1 - p0); constant-rate arrivals spaced 1/lambda apart see the earlier arrivals
  whose time in service S_r ~ U[S/2, 3S/2] has not yet run out. The two views are mixed
  linearly in the squared arrival CV (capped at the Poisson view).
* Bursts (arrival CV > 1): the slot wait W is scaled by (ca2 + 1) / 2 and the
  prefill-work queue (prefill_queue.py, shared with the percentile model) adds its wait beyond
  the Poisson one, E[W](ca2) - E[W](1); at or below Poisson neither changes anything.
* TTFT = W + b L_d / 2 + max(A, Q) + J + B + T_p + (L_d + d), with B the burst term and
  d = W_dec / m: the focal prefill iteration holds the others' decodes (L_d = alpha + X_o d), not
  a share of their prefills, so T_p = c_f L_d + W_pref(c_f) with c_f = c(round(X_o + 1)). The
  arrival waits for the decode part of the iteration in progress (b L_d / 2) and for the prompt
  work ahead of it: A = f b (R_P - L_d / 2 + C), the rest of that iteration's prompts
  (length-biased residual R_P, Allen-Cunneen factor f) and the prompts that arrived during its
  elapsed part (C = lambda R_P w), admitted first into the same step; or Q, the prefill-work
  queue's wait at arrival CV min(ca2, 1), when prompts back up beyond one step (with length
  spread at loads 0.5-0.7 it is the larger). J: the prompts arriving during the rest of it
  (mean f lambda R_P, Poisson) join the focal step while the budget left after the focal prompt
  and those ahead holds them. The first token is one decode iteration. ITL = (S-bar - T_p) / m
  as in the paper (total service conserved), floored at alpha + d.

A synchronous benchmark run (concurrency one, closed) has no chain: T_p = c(1) alpha +
W_pref(c(1)), ITL = alpha + d, TTFT = T_p + alpha + d.

The assembly is compiled (model/queueing/kernel/mean.py, kernel/arrivals.py); this module keeps
the constant-rate view per element of arrays for the percentile assembly (occupancy.py).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from model.queueing.kernel import arrivals as kernel_arrivals

FloatArray = NDArray[np.float64]


def seen_at_constant_rate(service_ms: FloatArray, rate_per_ms: FloatArray) -> FloatArray:
    """Mean number of earlier requests still in service when arrivals come exactly 1/lambda
    apart and time in service is U[S/2, 3S/2], per element (1-D, equal length); the assembly
    itself is compiled (model/queueing/kernel/mean.py, kernel/arrivals.py)."""
    seen, _ = _views(service_ms, rate_per_ms)
    return seen


def busy_at_constant_rate(service_ms: FloatArray, rate_per_ms: FloatArray) -> FloatArray:
    """P(S_r > 1/lambda): the previous arrival is still in service (engine busy)."""
    _, busy = _views(service_ms, rate_per_ms)
    return busy


def _views(service_ms: FloatArray, rate_per_ms: FloatArray) -> tuple[FloatArray, FloatArray]:
    service, rate = (
        np.ascontiguousarray(v, dtype=np.float64).reshape(-1)
        for v in np.broadcast_arrays(service_ms, rate_per_ms)
    )
    out: tuple[FloatArray, FloatArray] = kernel_arrivals.constant_rate_views(service, rate)
    return out
