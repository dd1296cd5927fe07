"""Latency and throughput at a given arrival rate: mean-field evaluation at X-bar. Spec §6, §7.

From the chain at lambda: throughput Lambda = lambda (1 - p_K), and by Little's law time in
service S-bar = X-bar / Lambda, response R = N / Lambda, queueing delay W = L_q / Lambda. The
paper's latencies take c-bar = c(round(X-bar)) (half up, clamped to 1..B) and
    T_p = c-bar max(0, alpha + (X-bar - 1) delta(c-bar)) + W_pref(c-bar),
    ITL = (S-bar - T_p) / m,   TTFT = W + T_p + ITL.
`ModelOptions` selects the latency assembly: the refined one (default; model/queueing/refined.py)
or the paper's; the chain and every other output are shared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from bench.baseline.vendor.model.queueing.chain import StateTable, solve_chain, state_table, workload_table
from bench.baseline.vendor.model.queueing.params import ServerConfig, ServiceParams, Workload
from bench.baseline.vendor.model.queueing.refined import refined_latencies
from bench.baseline.vendor.model.queueing.validation import require_rates
from bench.baseline.vendor.model.queueing.variant import DEFAULT_MODEL, ModelOptions

FloatArray = NDArray[np.float64]
Value = Any  # float for a scalar rate, a read-only numpy array for an array of rates

# MaxRate = 0.999 B / tau(B): sizing never searches above this fraction of the saturation rate
# (Go `RateRange.Max`). Spec §7.
MAX_RATE_FRACTION = 0.999

# Means that grow without bound when the infinite chain is unstable.
_DIVERGENT = (
    "ttft_ms",
    "itl_ms",
    "avg_wait_ms",
    "avg_prefill_ms",
    "avg_response_ms",
    "avg_num_in_system",
    "avg_queue_length",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Analysis:
    """Model outputs at each offered rate; ms and req/s. Spec §5-7.

    Every field is a float for a scalar rate and an array for an array of rates. An unstable
    rate (infinite waiting room, rate >= B / tau(B)) has stable=False and infinite latencies.
    """

    stable: Value
    offered_rate_rps: Value
    throughput_rps: Value
    ttft_ms: Value
    itl_ms: Value
    avg_wait_ms: Value
    avg_prefill_ms: Value
    avg_service_ms: Value
    avg_response_ms: Value
    avg_num_in_system: Value
    avg_batch_size: Value
    avg_queue_length: Value
    utilization: Value  # X-bar / B: batch-slot utilisation (Go `Rho`)
    busy_prob: Value  # 1 - p_0
    wait_prob: Value  # P(all B slots busy and requests waiting)
    blocking_prob: Value  # p_K: arrivals lost to a full finite waiting room
    chunks: Value  # c at the rounded mean occupancy
    max_rate_rps: Value  # 0.999 x saturation: the top of the sizing search
    saturation_rate_rps: Value  # B / tau(B)


def analyze(
    params: ServiceParams,
    server: ServerConfig,
    workload: Workload,
    rate_rps: ArrayLike,
    *,
    options: ModelOptions = DEFAULT_MODEL,
) -> Analysis:
    """Evaluate the model at a scalar rate or a 1-D array of rates (req/s, each >= 0)."""
    rates = require_rates("rate_rps", rate_rps)
    return analyze_table(workload_table(params, server, workload, options=options), rates)


def analyze_points(
    params: ServiceParams,
    server: ServerConfig,
    avg_input_tokens: ArrayLike,
    avg_output_tokens: ArrayLike,
    rate_rps: ArrayLike,
    *,
    options: ModelOptions = DEFAULT_MODEL,
    synchronous: ArrayLike | None = None,
) -> Analysis:
    """Evaluate K operating points, each with its own request shape and rate, in one call.

    The three arrays have length K; every field of the result is an array of length K.
    `synchronous` (K bools) marks closed concurrency-one runs, which the refined variant
    evaluates without the chain; the paper variant evaluates every point as open.
    """
    rates = np.atleast_1d(require_rates("rate_rps", rate_rps))
    n = np.atleast_1d(require_rates("avg_input_tokens", avg_input_tokens))
    m = np.atleast_1d(require_rates("avg_output_tokens", avg_output_tokens))
    if not rates.shape == n.shape == m.shape:
        raise ValueError(
            "`rate_rps`, `avg_input_tokens` and `avg_output_tokens` must have the same length, "
            f"got {rates.shape[0]}, {n.shape[0]}, {m.shape[0]}"
        )
    if np.any(m < 1):
        raise ValueError(f"`avg_output_tokens` must be >= 1, got {m[np.argmax(m < 1)]}")
    return analyze_table(
        state_table(params, server, n, m, options=options), rates, synchronous=synchronous
    )


def analyze_table(
    table: StateTable, rates_rps: FloatArray, *, synchronous: ArrayLike | None = None
) -> Analysis:
    """`analyze` on a precomputed state table (rates already validated; a 0-d array gives
    float fields). The variant is the one the table was built with."""
    scalar = np.ndim(rates_rps) == 0
    rates = np.atleast_1d(rates_rps).astype(np.float64)
    closed = _synchronous_mask(synchronous, rates.shape)
    lam = rates / 1000.0
    sol = solve_chain(table, lam)
    stable = sol.stable
    big_b = table.max_batch_size
    sat_per_ms = table.saturation_rate_per_ms
    if table.rows > 1:
        tau_1, tau_b, m = table.tau_ms[:, 0], table.tau_ms[:, -1], table.avg_output_tokens[:, 0]
    else:
        tau_1, tau_b, m = table.tau_ms[0, 0], table.tau_ms[0, -1], table.avg_output_tokens[0, 0]

    accepted = np.where(stable, lam * (1.0 - sol.p_block), sat_per_ms)
    positive = accepted > 0.0
    safe = np.where(positive, accepted, 1.0)
    # At rate 0 Little's ratios are 0/0; use their limits: an arrival finds an empty server, so
    # S-bar = R = tau(1) and W = 0 (spec §6).
    service = np.where(positive, sol.batch_occupancy / safe, tau_1)
    response = np.where(positive, sol.num_in_system / safe, tau_1)
    wait = np.where(positive, sol.queue_length / safe, 0.0)

    occupancy = sol.batch_occupancy
    zeros = np.zeros_like(rates)
    if table.options.refined:
        lat = refined_latencies(table, sol, lam, accepted, service, wait, closed)
        chunks, prefill, itl, ttft = lat.chunks, lat.prefill_ms, lat.itl_ms, lat.ttft_ms
    else:
        col = np.clip(np.floor(occupancy + 0.5), 1, big_b).astype(np.intp) - 1
        chunks = table.take(table.chunks, col)
        prefill = chunks * table.background_ms(occupancy, col) + table.take(table.w_pref_ms, col)
        itl = (service - prefill) / m
        ttft = wait + prefill + itl
    values: dict[str, NDArray[Any]] = {
        "stable": stable,
        "offered_rate_rps": rates,
        "throughput_rps": accepted * 1000.0,
        "ttft_ms": ttft,
        "itl_ms": itl,
        "avg_wait_ms": wait,
        "avg_prefill_ms": prefill,
        "avg_service_ms": service,
        "avg_response_ms": response,
        "avg_num_in_system": sol.num_in_system,
        "avg_batch_size": occupancy,
        "avg_queue_length": sol.queue_length,
        "utilization": np.minimum(occupancy / big_b, 1.0),
        "busy_prob": 1.0 - sol.p_empty,
        "wait_prob": sol.p_wait,
        "blocking_prob": sol.p_block,
        "chunks": chunks,
        "max_rate_rps": sat_per_ms * (MAX_RATE_FRACTION * 1000.0) + zeros,
        "saturation_rate_rps": sat_per_ms * 1000.0 + zeros,
    }
    if not stable.all():
        for name in _DIVERGENT:
            values[name] = np.where(stable, values[name], np.inf)
        values["avg_service_ms"] = np.where(stable, service, tau_b)
    if scalar:
        return Analysis(**{name: arr[0].item() for name, arr in values.items()})
    for arr in values.values():
        if arr.flags.writeable:
            arr.flags.writeable = False
    return Analysis(**values)


def _synchronous_mask(synchronous: ArrayLike | None, shape: tuple[int, ...]) -> NDArray[np.bool_]:
    """Per-rate flags of closed concurrency-one runs; all False when not given."""
    if synchronous is None:
        return np.zeros(shape, dtype=bool)
    flags = np.atleast_1d(np.asarray(synchronous))
    if flags.dtype != np.bool_ or flags.shape != shape:
        raise ValueError(
            f"`synchronous` must be a bool array of shape {shape}, got {flags.dtype} {flags.shape}"
        )
    return flags


def max_rate(
    params: ServiceParams,
    server: ServerConfig,
    workload: Workload,
    *,
    options: ModelOptions = DEFAULT_MODEL,
) -> float:
    """MaxRate = 0.999 B / tau(B): the highest rate sizing considers (req/s). Spec §7."""
    table = workload_table(params, server, workload, options=options)
    return float(MAX_RATE_FRACTION * table.saturation_rate_per_ms[0] * 1000.0)
