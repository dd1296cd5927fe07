"""The steepest parameter split one operating point allows.

Windows at one load pin the mean TTFT and ITL there, two figures for three parameters: along the
direction they leave open, alpha (the part of every iteration no load changes) trades against
the load parts (beta for the tokens an iteration computes, gamma for the context it reads), and
every split along it predicts the same two latencies at that load. They part above it: the less
of the latency alpha holds, the faster it grows with load and the lower the capacity. The split
with alpha at its lower bound is the most pessimistic the windows allow; claims beyond their
load are bounded by it (exporter/sizing/evidence.py).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import least_squares

from model.queueing.analyzer import analyze
from model.queueing.params import ServerConfig, ServiceParams, Workload
from model.queueing.variant import DEFAULT_MODEL, ModelOptions

# The split must reproduce both latencies at the load within this relative error.
SPLIT_TOLERANCE = 0.01


def steepest_split(
    params: ServiceParams,
    server: ServerConfig,
    workload: Workload,
    rate_rps: float,
    alpha_ms: float,
    *,
    options: ModelOptions = DEFAULT_MODEL,
) -> ServiceParams | None:
    """Parameters (ms) with alpha at `alpha_ms` whose mean TTFT and ITL at a per-replica
    `rate_rps` are those of `params`; `params` itself when its alpha is not above `alpha_ms`;
    None when no split reproduces them (the load saturates `params`, or no beta and gamma do)."""
    if params.alpha_ms <= alpha_ms:
        return params
    at = analyze(params, server, workload, rate_rps, options=options)
    ttft, itl = float(at.ttft_ms), float(at.itl_ms)
    if not (at.stable and math.isfinite(ttft) and math.isfinite(itl) and ttft > 0 and itl > 0):
        return None

    def split(x: NDArray[np.float64]) -> ServiceParams:
        return ServiceParams(alpha_ms, float(np.exp(x[0])), float(np.exp(x[1])))

    def errors(x: NDArray[np.float64]) -> list[float]:
        other = analyze(split(x), server, workload, rate_rps, options=options)
        if not other.stable:
            return [1e3, 1e3]
        return [float(other.ttft_ms) / ttft - 1.0, float(other.itl_ms) / itl - 1.0]

    start = np.log([params.beta_ms, params.gamma_ms])
    result = least_squares(errors, start, xtol=1e-10, ftol=1e-10)
    if max(abs(e) for e in errors(result.x)) > SPLIT_TOLERANCE:
        return None
    return split(result.x)
