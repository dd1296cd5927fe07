"""Latency percentiles from the calibrated chain: TTFT and the two kinds of ITL. Percentiles §1, §3.

`latency_quantiles` evaluates each metric at a fixed quasi-random point set
(model/queueing/latency_samples.py; per-token ITL with weights) and reads quantiles off the
sorted values as a step function: the q-quantile is the smallest value whose cumulative share
reaches q, and attainment at a target t is the share of values <= t, so attainment(t) >= q
exactly when quantile(q) <= t (sizing decides on attainment).

ITL comes in two kinds: per token, every inter-token gap (vLLM's inter_token_latency_seconds),
where iterations carrying prefill work make the tail; and per request, each request's mean gap
(request_time_per_output_token_seconds, GuideLLM, `vllm-sizer simulate`).

Where this assembly and `analyze`'s mean assembly differ: both share the chain, the work terms
and, by default, the first-token convention, and they agree at light load (with length CVs 0
at 1e-3 of saturation the means equal analyze's TTFT and ITL within 1 %, and so does the median
wherever fewer than 2 % of arrivals find the engine busy). Under load they part in four terms:
  * work ahead of a new prompt: here, per point, the prompts admitted with the iteration in
    progress and those arriving during it (Poisson counts), or the GI/G/1 queue on prompt work
    when prompts back up beyond a budget, whichever is longer; the refined mean takes the same
    two views at their means (a length-biased residual and the collision term C, scaled by an
    Allen-Cunneen factor, against the same prefill-work queue), the paper's mean neither;
  * later arrivals joining the prompt's iteration: both count them while the budget holds
    them (the refined mean from the mean count); the paper's mean does not;
  * the wait for a slot: here exponential per arrival; the means use W = L_q / Lambda;
  * ITL: here decode iterations at the lifetime-averaged occupancy, stretched by the share of
    the lifetime others' prefill work takes; the means take (S-bar - T_p) / m, which spreads
    every prompt's prefill evenly over the decode steps.
Accuracy is promised up to p99 (checked against the simulator by bench/percentiles.py); p99.9
rests on the one or two highest of the 1024 points and is indicative.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from numpy.typing import ArrayLike, NDArray

from model.queueing.chain import rate_block, workload_table
from model.queueing.latency_samples import (
    Setting,
    itl_request_samples,
    itl_token_samples,
    setting,
    ttft_samples,
)
from model.queueing.params import ServerConfig, ServiceParams, Workload
from model.queueing.validation import require_rates
from model.queueing.variant import DEFAULT_MODEL, ModelOptions

FloatArray = NDArray[np.float64]

MIN_QUANTILE = 0.01
MAX_QUANTILE = 0.999


class FirstToken(StrEnum):
    """When the first output token leaves. Fitted parameters (the tuner's, the paper's Table I)
    assume one decode iteration after the last prefill chunk; vLLM's scheduler and the simulator
    emit it with the last chunk."""

    AFTER_DECODE_ITERATION = "after_decode_iteration"
    WITH_LAST_CHUNK = "with_last_chunk"


class LatencyMetric(StrEnum):
    """The latency a percentile describes."""

    TTFT = "ttft"
    ITL_PER_TOKEN = "itl_per_token"
    ITL_PER_REQUEST = "itl_per_request"


@dataclass(frozen=True, slots=True, kw_only=True)
class LatencyQuantiles:
    """Quantiles (ms) of each metric: shape (len(quantiles),) for a scalar rate and
    (len(rates), len(quantiles)) for an array; +inf at unstable rates."""

    quantiles: FloatArray
    ttft_ms: FloatArray
    itl_per_token_ms: FloatArray
    itl_per_request_ms: FloatArray
    # The means of the same distributions: a float per rate (an array for an array of rates).
    mean_ttft_ms: FloatArray
    mean_itl_per_token_ms: FloatArray
    mean_itl_per_request_ms: FloatArray


@dataclass(frozen=True, slots=True)
class SortedLatencies:
    """Each metric's values sorted per rate with their cumulative shares (last = 1): two
    arrays of shape (rates, values), for quantiles and means (attainment: `share_within`)."""

    values: dict[LatencyMetric, tuple[FloatArray, FloatArray]]

    def quantile(self, metric: LatencyMetric, q: FloatArray) -> FloatArray:
        """The smallest value whose cumulative share reaches q, shape (rates, len(q))."""
        v, cum = self.values[metric]
        rows, count = v.shape
        offset = 2.0 * np.arange(rows, dtype=np.float64)[:, np.newaxis]
        # Row k's shares live in [2k, 2k + 1]: one flat search for every row; the 1e-12
        # forgives rounding in the cumulative sum.
        idx = np.searchsorted((cum + offset).reshape(-1),
                              (q[np.newaxis, :] - 1e-12 + offset).reshape(-1), side="left")
        col = np.clip(idx.reshape(rows, -1) - np.arange(rows)[:, np.newaxis] * count, 0, count - 1)
        out: FloatArray = np.take_along_axis(v, col, axis=1)
        return out

    def mean(self, metric: LatencyMetric) -> FloatArray:
        """The share-weighted mean per rate (+inf where any value is)."""
        v, cum = self.values[metric]
        share = np.diff(cum, axis=1, prepend=0.0)
        with np.errstate(invalid="ignore"):
            out: FloatArray = np.where(np.isinf(v).any(axis=1), np.inf, (v * share).sum(axis=1))
        return out



def share_within(values: FloatArray, weights: FloatArray | None, target_ms: float) -> FloatArray:
    """Share of the values (requests, or tokens when weighted) within target_ms, per rate
    (row); the values need not be sorted. The one attainment of the model: sizing probes it
    at many rates, the exporter at the sizing rate."""
    within = values <= target_ms
    if weights is None:
        out: FloatArray = within.sum(axis=1) / values.shape[1]
    else:
        out = (weights * within).sum(axis=1) / weights.sum(axis=1)
    return out


def _sorted(values: FloatArray, weights: FloatArray | None) -> tuple[FloatArray, FloatArray]:
    if weights is None:
        count = values.shape[1]
        cum = np.broadcast_to(np.arange(1, count + 1, dtype=np.float64) / count, values.shape)
        return np.sort(values, axis=1), cum
    order = np.argsort(values, axis=1)
    w = np.take_along_axis(weights, order, axis=1)
    cum = np.cumsum(w, axis=1)
    cum /= cum[:, -1:]
    return np.take_along_axis(values, order, axis=1), cum


def metric_values(
    s: Setting, metrics: tuple[LatencyMetric, ...], first_token: FirstToken
) -> dict[LatencyMetric, tuple[FloatArray, FloatArray | None]]:
    """The chosen metrics at the sample points, unsorted, each with its shares (None: equal)."""
    out: dict[LatencyMetric, tuple[FloatArray, FloatArray | None]] = {}
    for metric in metrics:
        if metric is LatencyMetric.TTFT:
            after = first_token is FirstToken.AFTER_DECODE_ITERATION
            out[metric] = (ttft_samples(s, after), None)
        elif metric is LatencyMetric.ITL_PER_REQUEST:
            out[metric] = (itl_request_samples(s), None)
        else:
            out[metric] = itl_token_samples(s)
    return out


def sorted_latencies(
    s: Setting, metrics: tuple[LatencyMetric, ...], first_token: FirstToken
) -> SortedLatencies:
    """The chosen metrics at the sample points, sorted per rate."""
    return sort_values(metric_values(s, metrics, first_token))


def sort_values(
    found: dict[LatencyMetric, tuple[FloatArray, FloatArray | None]],
) -> SortedLatencies:
    """`metric_values` sorted per rate."""
    return SortedLatencies({k: _sorted(*v) for k, v in found.items()})


def require_quantiles(value: ArrayLike) -> FloatArray:
    """A non-empty 1-D array of probabilities in [0.01, 0.999]."""
    q = np.atleast_1d(np.asarray(value, dtype=np.float64))
    if q.ndim != 1 or q.size == 0:
        raise ValueError(f"`quantiles` must be a non-empty 1-D sequence, got shape {q.shape}")
    bad = ~np.isfinite(q) | (q < MIN_QUANTILE) | (q > MAX_QUANTILE)
    if bad.any():
        raise ValueError(
            f"`quantiles` must lie in [{MIN_QUANTILE}, {MAX_QUANTILE}], got {q[np.argmax(bad)]}"
        )
    return q


def latency_quantiles(
    params: ServiceParams,
    server: ServerConfig,
    workload: Workload,
    rate_rps: ArrayLike,
    quantiles: ArrayLike,
    *,
    options: ModelOptions = DEFAULT_MODEL,
    first_token: FirstToken = FirstToken.AFTER_DECODE_ITERATION,
) -> LatencyQuantiles:
    """Quantiles (ms) of TTFT, per-token ITL and per-request ITL at a scalar rate or a 1-D array
    of rates (req/s, each >= 0), for probabilities in [0.01, 0.999]. Deterministic; +inf where
    the rate is unstable. `options` gives the variant (its state table) and the arrival and
    length CVs (used by either variant)."""
    rates = require_rates("rate_rps", rate_rps)
    q = require_quantiles(quantiles)
    first = FirstToken(first_token)
    table = workload_table(params, server, workload, options=options)
    flat = np.atleast_1d(rates)
    parts: dict[LatencyMetric, list[FloatArray]] = {metric: [] for metric in LatencyMetric}
    means: dict[LatencyMetric, list[FloatArray]] = {metric: [] for metric in LatencyMetric}
    # Blocks of rates keep the (rates x points) work arrays in cache.
    block = rate_block(server.max_batch_size)
    for start in range(0, flat.size, block):
        s = setting(params, server, workload, table, flat[start : start + block])
        found = sorted_latencies(s, tuple(LatencyMetric), first)
        for metric in LatencyMetric:
            parts[metric].append(found.quantile(metric, q))
            means[metric].append(found.mean(metric))
    out = {metric: np.concatenate(v) for metric, v in parts.items()}
    avg = {metric: np.concatenate(v) for metric, v in means.items()}
    if rates.ndim == 0:
        out = {metric: v[0] for metric, v in out.items()}
        avg = {metric: v[0:1].reshape(()) for metric, v in avg.items()}
    for v in (*out.values(), *avg.values(), q):
        v.flags.writeable = False
    return LatencyQuantiles(
        quantiles=q,
        ttft_ms=out[LatencyMetric.TTFT],
        itl_per_token_ms=out[LatencyMetric.ITL_PER_TOKEN],
        itl_per_request_ms=out[LatencyMetric.ITL_PER_REQUEST],
        mean_ttft_ms=avg[LatencyMetric.TTFT],
        mean_itl_per_token_ms=avg[LatencyMetric.ITL_PER_TOKEN],
        mean_itl_per_request_ms=avg[LatencyMetric.ITL_PER_REQUEST],
    )
