"""Predicted against observed TTFT and ITL attainment at vLLM's bucket bounds. Issue 18.

Observed: the share of a sweep point's requests (TTFT) or inter-token gaps (ITL, vLLM's
`inter_token_latency_seconds`: per token) within each bucket bound, from the bucket counts the
point's whole window added to the histogram (`WindowHistogram`, as the daemon reads them; exact
at a bound). Predicted: the model's share within the same bound at the point's observed arrival
rate and mean shape, as the daemon computes its predicted attainment (`predicted_percentiles`:
the percentile assembly read with `share_within`), with the first token one decode iteration
after the last prefill chunk (the fitted parameters' convention) and length CVs 0 (the load
generator sends exact shapes).

A gap is predicted minus observed, in percentage points (positive: the model promises more
requests within the bound than vLLM served). The summary averages its absolute value over the
bounds within the observed range: from the lowest bound with any observation at or below it to
the lowest with all of them. Bounds outside read 0 or 1 on both sides and would only dilute it.
Saturated points (left out of the fits) are shown but left out of the summary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from exporter.collector.vllm_metrics import HistogramName
from exporter.sizing.slo_targets import predicted_percentiles
from model import (
    DEFAULT_MODEL,
    LatencyMetric,
    Observation,
    PercentileTarget,
    ServerConfig,
    ServiceParams,
    Workload,
)
from model.calibration.histogram import WindowHistogram

FloatArray = NDArray[np.float64]

MS_PER_S = 1e3
# Which model metric and which vLLM histogram each reported metric compares.
METRICS: Mapping[str, tuple[LatencyMetric, HistogramName]] = {
    "ttft": (LatencyMetric.TTFT, HistogramName.TTFT_S),
    "itl": (LatencyMetric.ITL_PER_TOKEN, HistogramName.ITL_S),
}
# A target's quantile does not enter its attainment (the share within its bound); any valid one.
_ANY_QUANTILE = 0.5
# Cumulative shares are ratios of float counts: this close to 1 is all of them.
_ALL = 1.0 - 1e-12


@dataclass(frozen=True, slots=True, kw_only=True)
class BoundShare:
    """Observed and predicted share within one bucket bound (ms)."""

    bound_ms: float
    observed: float
    predicted: float
    in_range: bool

    @property
    def gap_points(self) -> float:
        """Predicted minus observed, percentage points."""
        return 100.0 * (self.predicted - self.observed)


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricAttainment:
    """One metric of one point: the observations counted (requests or gaps) and every bound."""

    observations: float
    shares: tuple[BoundShare, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PointAttainment:
    """One sweep point's attainment per metric name (METRICS) under one fit."""

    index: int
    saturated: bool
    metrics: Mapping[str, MetricAttainment]


def window_histogram(record: Mapping[str, Any]) -> WindowHistogram:
    """A histogram as the sweep stores it (`BucketDelta`: bounds in s)."""
    return WindowHistogram(bounds=np.asarray(record["bounds_s"], dtype=np.float64),
                           counts=np.asarray(record["counts"], dtype=np.float64),
                           sum=float(record["sum_s"]), count=float(record["count"]))


def observed_shares(hist: WindowHistogram) -> FloatArray | None:
    """Share within each finite bound, exact; None without observations."""
    shares = [hist.share_at_most(float(b)) for b in hist.bounds]
    if any(s is None for s in shares):
        return None
    return np.array(shares, dtype=np.float64)


def in_observed_range(observed: FloatArray) -> NDArray[np.bool_]:
    """The bounds from the lowest with any observation at or below it to the lowest with all."""
    mask = np.zeros(observed.size, dtype=bool)
    some = np.flatnonzero(observed > 0)
    if some.size == 0:
        return mask
    full = np.flatnonzero(observed >= _ALL)
    last = int(full[0]) if full.size else observed.size - 1
    mask[int(some[0]) : last + 1] = True
    return mask


def predicted_shares(params: ServiceParams, server: ServerConfig, obs: Observation,
                     metric: LatencyMetric, bounds_ms: Sequence[float]) -> FloatArray:
    """The model's share within each bound at the observation's rate and shape."""
    targets = [PercentileTarget(metric, _ANY_QUANTILE, b) for b in bounds_ms]
    workload = Workload(obs.avg_input_tokens, max(obs.avg_output_tokens, 1.0))
    found = predicted_percentiles(targets, params, server, workload, obs.rate_rps, DEFAULT_MODEL)
    return np.array([p.attainment for p in found], dtype=np.float64)


def point_attainment(index: int, point: Mapping[str, Any], obs: Observation | None,
                     params: ServiceParams, server: ServerConfig) -> PointAttainment | None:
    """Observed against predicted shares of one point; None without an observation or bucket
    counts (a sweep recorded before they were kept)."""
    stored = point["observation"].get("histograms") or {}
    if obs is None or not stored:
        return None
    metrics: dict[str, MetricAttainment] = {}
    for name, (metric, histogram) in METRICS.items():
        record = stored.get(histogram.value)
        if record is None:
            continue
        hist = window_histogram(record)
        observed = observed_shares(hist)
        if observed is None:
            continue
        bounds_ms = [float(b) * MS_PER_S for b in hist.bounds]
        predicted = predicted_shares(params, server, obs, metric, bounds_ms)
        mask = in_observed_range(observed)
        metrics[name] = MetricAttainment(
            observations=float(hist.counts.sum()),
            shares=tuple(BoundShare(bound_ms=b, observed=float(o), predicted=float(p),
                                    in_range=bool(m))
                         for b, o, p, m in zip(bounds_ms, observed, predicted, mask, strict=True)),
        )
    return PointAttainment(index=index, saturated=obs.queue_growing, metrics=metrics)


def sweep_attainment(
    points: Sequence[Mapping[str, Any]], obs: Sequence[Observation | None], server: ServerConfig,
    in_sample: ServiceParams, held_out: Sequence[tuple[ServiceParams, Sequence[int]]],
) -> tuple[list[PointAttainment], list[PointAttainment]]:
    """Every point under the all-shapes fit, and each held-out point under the fit of the
    other half."""
    every = [a for i, p in enumerate(points)
             if (a := point_attainment(i, p, obs[i], in_sample, server)) is not None]
    held = [a for params, test in held_out for i in test
            if (a := point_attainment(i, points[i], obs[i], params, server)) is not None]
    return every, held


def summarize(points: Sequence[PointAttainment]) -> dict[str, Any]:
    """Per metric over the unsaturated points' in-range bounds: mean absolute and mean signed
    gap (points), the largest absolute gap, and how many bounds and points."""
    out: dict[str, Any] = {}
    for name in METRICS:
        gaps = [s.gap_points for p in points if not p.saturated and name in p.metrics
                for s in p.metrics[name].shares if s.in_range]
        arr = np.array(gaps, dtype=np.float64)
        out[name] = {
            "points": sum(1 for p in points if not p.saturated and name in p.metrics),
            "bounds": int(arr.size),
            "mean_abs_gap_points": float(np.abs(arr).mean()) if arr.size else None,
            "mean_gap_points": float(arr.mean()) if arr.size else None,
            "max_abs_gap_points": float(np.abs(arr).max()) if arr.size else None,
        }
    return out


def to_json(point: PointAttainment) -> dict[str, Any]:
    """A point's attainment for the report's JSON."""
    return {
        "index": point.index,
        "saturated": point.saturated,
        "metrics": {
            name: {"observations": m.observations,
                   "bounds_ms": [s.bound_ms for s in m.shares],
                   "observed": [s.observed for s in m.shares],
                   "predicted": [s.predicted for s in m.shares],
                   "in_range": [s.in_range for s in m.shares]}
            for name, m in point.metrics.items()
        },
    }


def markdown(points: Sequence[PointAttainment], summary: Mapping[str, Any],
             held_out: Mapping[str, Any] | None, labels: Sequence[str]) -> list[str]:
    """The report's section: how it is computed, the summary, a table per point (`labels[i]`
    names point i)."""
    lines = [
        "## Attainment at vLLM's bucket bounds",
        "",
        "Share of requests (TTFT) or of inter-token gaps (ITL, per token) within each bucket "
        "bound: observed from the bucket counts each point's whole window added to vLLM's "
        "histograms, predicted by the percentile assembly with the all-shapes fit at the "
        "point's observed rate and shape, as the daemon computes its predicted attainment "
        "(first token one decode iteration after the last prefill chunk, the fitted "
        "parameters' convention). Gap = predicted - observed in percentage points (positive: the "
        "model promises more within the bound than vLLM served). Summary over the bounds within "
        "each point's observed range (from the lowest bound with any observation below it to "
        "the lowest with all), saturated points left out.",
        "",
        "| fit | metric | points | bounds | mean abs gap (points) | mean gap (points) | "
        "largest abs gap (points) |",
        "|---|---|---|---|---|---|---|",
    ]
    for fit_name, found in (("all shapes (in-sample)", summary), ("held out", held_out)):
        if found is None:
            continue
        for name in METRICS:
            s = found[name]
            lines.append(f"| {fit_name} | {name.upper()} | {s['points']} | {s['bounds']} | "
                         f"{points_text(s['mean_abs_gap_points'])} | "
                         f"{points_text(s['mean_gap_points'])} | "
                         f"{points_text(s['max_abs_gap_points'])} |")
    lines.append("")
    for point in points:
        lines += point_table(point, labels[point.index])
    return lines


def point_table(point: PointAttainment, label: str) -> list[str]:
    """One point's in-range bounds: observed and predicted shares (%) and the gap."""
    counted = ", ".join(f"{m.observations:.0f} {'requests' if name == 'ttft' else 'gaps'}"
                        for name, m in point.metrics.items())
    note = "; saturated, not in the summary" if point.saturated else ""
    lines = [f"### {label} ({counted}{note})", "",
             "| metric | bound (ms) | observed | predicted | gap (points) |",
             "|---|---|---|---|---|"]
    for name, m in point.metrics.items():
        for s in m.shares:
            if s.in_range:
                lines.append(f"| {name.upper()} | {s.bound_ms:g} | {100 * s.observed:.1f}% | "
                             f"{100 * s.predicted:.1f}% | {s.gap_points:+.1f} |")
    return [*lines, ""]


def point_line(point: PointAttainment, label: str) -> str:
    """One console line per point: each metric's mean |gap| over its in-range bounds."""
    parts = []
    for name, m in point.metrics.items():
        gaps = [abs(s.gap_points) for s in m.shares if s.in_range]
        mean = float(np.mean(gaps)) if gaps else None
        parts.append(f"{name.upper()} mean |gap| {points_text(mean)} points over "
                     f"{len(gaps)} bounds")
    note = " (saturated)" if point.saturated else ""
    return f"  {label}{note}: {'; '.join(parts)}"


def points_text(value: float | None) -> str:
    """A gap in percentage points, or n/a."""
    return "n/a" if value is None else f"{value:.1f}"
