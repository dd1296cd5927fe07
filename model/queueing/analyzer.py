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

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from model.queueing.chain import (
    StateTable,
    evaluate,
    kernel_inputs,
    workload_table,
)
from model.queueing.kernel import mean as kernel_mean
from model.queueing.params import ServerConfig, ServiceParams, Workload
from model.queueing.validation import require_rates
from model.queueing.variant import DEFAULT_MODEL, ModelOptions

FloatArray = NDArray[np.float64]
Value = Any  # float for a scalar rate, a read-only numpy array for an array of rates

# MaxRate = 0.999 B / tau(B): sizing never searches above this fraction of the saturation rate
# (Go `RateRange.Max`). Spec §7.
MAX_RATE_FRACTION = kernel_mean.MAX_RATE_FRACTION


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
    # The TTFT when the first token leaves with the last prefill chunk (vLLM's scheduler, the
    # simulator; FirstToken.WITH_LAST_CHUNK): ttft_ms without its first-token iteration.
    ttft_with_last_chunk_ms: Value
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
    if isinstance(rate_rps, float | int) and not isinstance(rate_rps, bool):
        rate = float(rate_rps)
        if math.isfinite(rate) and rate >= 0:
            # One rate: the table and the chain in one compiled call, no intermediate arrays.
            out = kernel_mean.analyze_one(
                workload.avg_input_tokens, workload.avg_output_tokens, params.alpha_ms,
                params.beta_ms, params.gamma_ms, *kernel_inputs(server, options), rate,
            )  # fmt: skip
            return _scalar_analysis(out.tolist(), rate)
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
    closed = _synchronous_mask(synchronous, rates.shape)
    # Writeable contiguous copies: the kernel is compiled for those (a caller's read-only
    # array would compile another specialization).
    rates = np.array(rates, dtype=np.float64)
    out = kernel_mean.point_outputs(
        np.array(n, dtype=np.float64), np.array(m, dtype=np.float64), rates, closed,
        np.array([params.as_tuple()]), *kernel_inputs(server, options),
    )  # fmt: skip
    return analysis_of(out, rates, scalar=False)


# Analysis fields in the kernel's output rows (kernel_mean), after `stable` and the rate.
_FIELD_ROWS = {
    "throughput_rps": kernel_mean.THROUGHPUT,
    "ttft_ms": kernel_mean.TTFT,
    "ttft_with_last_chunk_ms": kernel_mean.TTFT_CHUNK,
    "itl_ms": kernel_mean.ITL,
    "avg_wait_ms": kernel_mean.WAIT,
    "avg_prefill_ms": kernel_mean.PREFILL,
    "avg_service_ms": kernel_mean.SERVICE,
    "avg_response_ms": kernel_mean.RESPONSE,
    "avg_num_in_system": kernel_mean.NUM,
    "avg_batch_size": kernel_mean.BATCH,
    "avg_queue_length": kernel_mean.QUEUE,
    "utilization": kernel_mean.UTIL,
    "busy_prob": kernel_mean.BUSY,
    "wait_prob": kernel_mean.WAIT_PROB,
    "blocking_prob": kernel_mean.BLOCK,
}


def point_latencies(
    theta: FloatArray,
    server: ServerConfig,
    avg_input_tokens: FloatArray,
    avg_output_tokens: FloatArray,
    rate_rps: FloatArray,
    *,
    options: ModelOptions = DEFAULT_MODEL,
    synchronous: NDArray[np.bool_],
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """TTFT, ITL (ms; inf when unstable) and saturation rate (req/s) of K operating points
    (validated 1-D arrays of length K, as for `analyze_points`) under each of P parameter
    vectors theta[p] = (alpha, beta, gamma) (ms), in one compiled call: shape (P, K) each."""
    out = kernel_mean.point_outputs(
        avg_input_tokens, avg_output_tokens, rate_rps, synchronous, theta,
        *kernel_inputs(server, options),
    )  # fmt: skip
    shape = (theta.shape[0], avg_input_tokens.shape[0])
    return (
        out[kernel_mean.TTFT].reshape(shape),
        out[kernel_mean.ITL].reshape(shape),
        out[kernel_mean.SATURATION].reshape(shape),
    )


def analyze_table(
    table: StateTable, rates_rps: FloatArray, *, synchronous: ArrayLike | None = None
) -> Analysis:
    """`analyze` on a precomputed state table (rates already validated; a 0-d array gives
    float fields). The variant is the one the table was built with."""
    rates = np.atleast_1d(rates_rps).astype(np.float64)
    closed = _synchronous_mask(synchronous, rates.shape)
    out, _ = evaluate(table, rates, closed)
    return analysis_of(out, rates, scalar=np.ndim(rates_rps) == 0)


def analysis_of(out: FloatArray, rates: FloatArray, *, scalar: bool) -> Analysis:
    """The Analysis of the kernel's outputs (FIELDS x rates) at the given rates (req/s)."""
    if scalar:
        return _scalar_analysis(out[:, 0].tolist(), float(rates[0]))
    out.flags.writeable = False
    rates.flags.writeable = False
    chunks = out[kernel_mean.CHUNK_COUNT].astype(np.int64)
    stable = out[kernel_mean.STABLE] > 0.0
    for arr in (chunks, stable):
        arr.flags.writeable = False
    return Analysis(
        stable=stable,
        offered_rate_rps=rates,
        chunks=chunks,
        max_rate_rps=out[kernel_mean.MAX_RATE],
        saturation_rate_rps=out[kernel_mean.SATURATION],
        **{name: out[k] for name, k in _FIELD_ROWS.items()},
    )


# A scalar Analysis is filled through its slots' setters: the frozen __init__ (keyword
# parsing, then object.__setattr__ per field) took 5 us, half of a one-shot `analyze`.
def _setter(name: str) -> Callable[[Analysis, object], None]:
    setter: Callable[[Analysis, object], None] = getattr(Analysis, name).__set__
    return setter


_SETTERS = tuple((_setter(name), k) for name, k in _FIELD_ROWS.items())
_SET_STABLE, _SET_RATE, _SET_CHUNKS, _SET_MAX_RATE, _SET_SATURATION = (
    _setter(name)
    for name in ("stable", "offered_rate_rps", "chunks", "max_rate_rps", "saturation_rate_rps")
)


def _scalar_analysis(col: list[float], rate_rps: float) -> Analysis:
    out = object.__new__(Analysis)
    _SET_STABLE(out, col[kernel_mean.STABLE] > 0.0)
    _SET_RATE(out, rate_rps)
    for setter, k in _SETTERS:
        setter(out, col[k])
    _SET_CHUNKS(out, int(col[kernel_mean.CHUNK_COUNT]))
    _SET_MAX_RATE(out, col[kernel_mean.MAX_RATE])
    _SET_SATURATION(out, col[kernel_mean.SATURATION])
    return out


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
