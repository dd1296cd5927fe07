"""The largest rate at which every percentile target is attained. Percentiles §3.

A target (metric, q, T ms) is met at a rate when the attainment there, the share of requests
(or, for per-token ITL, of tokens) within T, is at least q. Attainment is read off the fixed
sample points of model/queueing/percentiles.py, where each point's latency grows with the rate,
so attainment falls as the rate rises (exactly so where the chunk count does not change).
The search mirrors the mean one (model/queueing/sizing.py): a scan of [lo, hi] for the first
rate where some target is missed, then the bracket cut in eighths until it is narrower than
REFINE_REL_WIDTH of its lower end. The rate returned meets every target; the end of its
bracket, at most 2e-5 above, misses one. Each pass evaluates the metric that missed first
last time at every probe and the others only up to its first miss (the answer is the same:
every metric is computed rate by rate).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from model.queueing.chain import StateTable
from model.queueing.latency_samples import setting
from model.queueing.params import ServerConfig, ServiceParams, Workload
from model.queueing.percentiles import (
    MAX_QUANTILE,
    MIN_QUANTILE,
    FirstToken,
    LatencyMetric,
    metric_values,
    share_within,
    sort_values,
)
from model.queueing.validation import require_positive

FloatArray = NDArray[np.float64]

SCAN_POINTS = 8  # first pass over [lo, hi]
REFINE_REL_WIDTH = 2e-5  # stop when the bracket is this narrow relative to its lower end
_SPLITS = np.arange(1, 8) / 8.0  # each later pass cuts the bracket in eighths


@dataclass(frozen=True, slots=True)
class PercentileTarget:
    """An SLO on a latency percentile: at least `quantile` of requests (tokens, for per-token
    ITL) within `target_ms`. `quantile` in [0.01, 0.999] (0.95 for p95)."""

    metric: LatencyMetric
    quantile: float
    target_ms: float

    def __post_init__(self) -> None:
        try:
            metric = LatencyMetric(self.metric)
        except ValueError as exc:
            allowed = ", ".join(repr(m.value) for m in LatencyMetric)
            raise ValueError(f"`metric` must be one of {allowed}, got {self.metric!r}") from exc
        object.__setattr__(self, "metric", metric)
        q = require_positive("quantile", self.quantile)
        if not MIN_QUANTILE <= q <= MAX_QUANTILE:
            raise ValueError(
                f"`quantile` must lie in [{MIN_QUANTILE}, {MAX_QUANTILE}], got {self.quantile}"
            )
        object.__setattr__(self, "quantile", q)
        object.__setattr__(self, "target_ms", require_positive("target_ms", self.target_ms))

    @property
    def name(self) -> str:
        """e.g. 'ttft_p95', 'itl_per_token_p99', 'ttft_p99.9'."""
        return f"{self.metric.value}_p{round(self.quantile * 100, 6):g}"


@dataclass(frozen=True, slots=True, kw_only=True)
class PercentileCrossing:
    """Where the percentile targets stop being met: rate (req/s; None when a target is missed
    at lo), the target that binds first (None when all hold up to hi) and each target's
    attainment at the rate (at lo when infeasible)."""

    rate_rps: float | None
    binding: PercentileTarget | None
    attainment: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class _Probe:
    """Attainment of the targets at given rates."""

    params: ServiceParams
    server: ServerConfig
    workload: Workload
    table: StateTable
    targets: tuple[PercentileTarget, ...]
    first_token: FirstToken

    def attainment(self, rates_rps: FloatArray) -> FloatArray:
        """Share within each target (columns) at each rate (rows): of requests, or of tokens
        for per-token ITL."""
        s = setting(self.params, self.server, self.workload, self.table, rates_rps)
        metrics = tuple(dict.fromkeys(t.metric for t in self.targets))
        found = metric_values(s, metrics, self.first_token)
        return np.stack([share_within(*found[t.metric], t.target_ms) for t in self.targets], axis=1)

    def met(self, attainment: FloatArray) -> NDArray[np.bool_]:
        """Per rate: every target attained."""
        quant = np.array([t.quantile for t in self.targets])
        met = np.asarray((attainment >= quant).all(axis=1), dtype=bool)
        return met

    def first_miss(self, rates_rps: FloatArray, lead: LatencyMetric) -> tuple[int, FloatArray]:
        """The first of the rising rates at which some target is missed (len(rates) if none)
        and each target's attainment (columns) at the rates up to it (rows; NaN beyond).

        The same answer as `attainment` at every rate, with less work: each metric is
        evaluated rate by rate, so once one metric's targets are missed at a rate, the others
        are evaluated only up to it. `lead` goes first (the metric that missed first last
        time: the others then stop earliest)."""
        s = setting(self.params, self.server, self.workload, self.table, rates_rps)
        metrics = sorted(dict.fromkeys(t.metric for t in self.targets), key=lambda m: m != lead)
        quant = np.array([t.quantile for t in self.targets])
        att = np.full((rates_rps.size, len(self.targets)), np.nan)
        stop = rates_rps.size  # rows evaluated for every metric so far hold the first miss
        for metric in metrics:
            found = metric_values(s if stop == rates_rps.size else s.head(stop), (metric,),
                                  self.first_token)[metric]  # fmt: skip
            cols = [k for k, t in enumerate(self.targets) if t.metric is metric]
            for k in cols:
                att[:stop, k] = share_within(*found, self.targets[k].target_ms)
            missed = (~(att[:stop, cols] >= quant[cols])).any(axis=1)
            if missed.any():
                stop = int(np.argmax(missed)) + 1
        missed = ~self.met(att[:stop])
        return (int(np.argmax(missed)) if missed.any() else rates_rps.size), att


def attainment_at(
    params: ServiceParams,
    server: ServerConfig,
    workload: Workload,
    table: StateTable,
    targets: Sequence[PercentileTarget],
    first_token: FirstToken,
    rate_rps: float,
) -> tuple[float, ...]:
    """Each target's attainment at one rate (req/s)."""
    probe = _Probe(params, server, workload, table, tuple(targets), first_token)
    return tuple(float(a) for a in probe.attainment(np.array([rate_rps]))[0])


def target_percentiles(
    params: ServiceParams,
    server: ServerConfig,
    workload: Workload,
    table: StateTable,
    targets: Sequence[PercentileTarget],
    first_token: FirstToken,
    rate_rps: float,
) -> tuple[tuple[float, float], ...]:
    """Each target's percentile (ms; +inf where the rate is unstable) and attainment at one
    rate (req/s), from one evaluation of the sample points."""
    s = setting(params, server, workload, table, np.array([rate_rps]))
    found = metric_values(s, tuple(dict.fromkeys(t.metric for t in targets)), first_token)
    ordered = sort_values(found)
    return tuple(
        (
            float(ordered.quantile(t.metric, np.array([t.quantile]))[0, 0]),
            float(share_within(*found[t.metric], t.target_ms)[0]),
        )
        for t in targets
    )


def percentile_crossing(
    params: ServiceParams,
    server: ServerConfig,
    workload: Workload,
    table: StateTable,
    targets: Sequence[PercentileTarget],
    first_token: FirstToken,
    lo: float,
    hi: float,
) -> PercentileCrossing:
    """The largest rate in [lo, hi] (req/s) up to which every target is attained."""
    probe = _Probe(params, server, workload, table, tuple(targets), first_token)
    quant = np.array([t.quantile for t in probe.targets])
    grid = np.linspace(lo, hi, SCAN_POINTS)
    lead = probe.targets[0].metric
    j, att = probe.first_miss(grid, lead)
    if j == grid.size:
        return PercentileCrossing(rate_rps=hi, binding=None, attainment=tuple(att[-1]))
    if j == 0:
        worst = int(np.argmin(att[0] - quant))
        return PercentileCrossing(
            rate_rps=None, binding=probe.targets[worst], attainment=tuple(att[0])
        )
    low, high = float(grid[j - 1]), float(grid[j])
    att_low, att_high = att[j - 1], att[j]
    # Probes depend only on the bracket, never on attainment values: a looser target, met
    # wherever the tighter one is, then never ends below it.
    while high - low > REFINE_REL_WIDTH * low:
        rates = low + (high - low) * _SPLITS
        rates = rates[(rates > low) & (rates < high)]
        if rates.size == 0:
            break
        lead = probe.targets[int(np.argmin(att_high - quant))].metric
        k, att = probe.first_miss(rates, lead)
        if k < rates.size:
            high, att_high = float(rates[k]), att[k]
            if k > 0:
                low, att_low = float(rates[k - 1]), att[k - 1]
        else:
            low, att_low = float(rates[-1]), att[-1]
    worst = int(np.argmin(att_high - quant))
    return PercentileCrossing(
        rate_rps=low, binding=probe.targets[worst], attainment=tuple(float(a) for a in att_low)
    )
