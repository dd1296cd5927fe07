"""Simulated latency quantiles at one operating point, for bench/percentiles.py.

One replica of the request-level simulator (the first token leaves with the last prefill chunk,
as in vLLM) under Poisson or constant-rate arrivals. Requests arriving during a warm-up and a
cool-down of twice the model's mean response time are not measured; the per-token gaps counted
are those of iterations ending inside the measured window.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from model import ModelOptions, ServerConfig, ServiceParams, Workload, analyze
from model.simulation.simulator import Simulator
from model.simulation.workloads import LengthDist, LengthKind, RateProfile, draw_trace

QUANTILES = (0.5, 0.9, 0.95, 0.99)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimPoint:
    """Measured quantiles (ms, at QUANTILES) and the measured requests' mean lengths."""

    measured: int
    mean_input_tokens: float
    mean_output_tokens: float
    ttft_ms: list[float]
    itl_per_request_ms: list[float]
    itl_per_token_ms: list[float]
    wall_s: float


def weighted_quantiles(
    values: NDArray[np.float64], weights: NDArray[np.float64], qs: tuple[float, ...]
) -> list[float]:
    """Quantiles of a weighted sample: the smallest value whose cumulative weight reaches q."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    idx = np.searchsorted(cum, np.asarray(qs) * cum[-1], side="left")
    return [float(v) for v in values[order][np.minimum(idx, values.size - 1)]]


def simulate_point(
    params: ServiceParams,
    server: ServerConfig,
    n: int,
    m: int,
    rate_rps: float,
    arrival_cv: float,
    requests: int,
    seed: int,
    options: ModelOptions,
) -> SimPoint:
    began = time.perf_counter()
    mean = analyze(params, server, Workload(float(n), float(m)), rate_rps, options=options)
    margin_s = 2.0 * float(mean.avg_response_ms) / 1000.0
    # Enough arrivals that `requests` of them fall in the measured window for any seed.
    span_s = (requests + 6.0 * requests**0.5 + 10.0) / rate_rps
    rng = np.random.default_rng(seed)
    profile = RateProfile.constant(rate_rps, 2 * margin_s + span_s)
    trace = draw_trace(
        profile, LengthDist(LengthKind.UNIFORM, n), LengthDist(LengthKind.UNIFORM, m), rng,
        cv=arrival_cv,
    )
    sim = Simulator(params, server, record_iterations=True)
    sim.add_requests(trace)
    window_end_s = float(trace.arrival_s[min(len(trace) - 1, np.searchsorted(
        trace.arrival_s, margin_s, side="right") + requests - 1)])
    gaps: list[NDArray[np.float64]] = []
    weights: list[NDArray[np.int64]] = []
    while sim.peek() < float("inf"):
        sim.run(sim.now_s + 50.0)
        for rec in sim.drain_records():
            if margin_s < rec.end_s <= window_end_s and rec.gap_s.size:
                gaps.append(rec.gap_s)
                weights.append(rec.gap_weight)
    res = sim.result()
    after = np.flatnonzero(res.arrival_s > margin_s)[:requests]
    keep = np.zeros(res.arrived, dtype=bool)
    keep[after] = True
    ttft = res.ttft_ms[keep]
    itl = res.itl_ms[keep]
    itl = itl[np.isfinite(itl)]
    gap_ms = np.concatenate(gaps) * 1000.0
    gap_w = np.concatenate(weights).astype(np.float64)
    return SimPoint(
        measured=int(keep.sum()),
        mean_input_tokens=float(res.input_tokens[keep].mean()),
        mean_output_tokens=float(res.output_tokens[keep].mean()),
        ttft_ms=[float(v) for v in np.quantile(ttft, QUANTILES)],
        itl_per_request_ms=[float(v) for v in np.quantile(itl, QUANTILES)],
        itl_per_token_ms=weighted_quantiles(gap_ms, gap_w, QUANTILES),
        wall_s=time.perf_counter() - began,
    )
