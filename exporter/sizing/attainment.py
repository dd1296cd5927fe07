"""Observed SLO attainment from vLLM's latency histograms over `slo_window_s`. Percentiles §2.

vLLM's histograms tell the share of requests (TTFT, per-request ITL) or of gaps (per-token ITL)
within a target exactly only when the target is a bucket bound: a TTFT target of 50 ms lies
inside the (40, 60] ms bucket, so all that is known is a bracket, [share at 40 ms, share at
60 ms]. Attainment is reported that way: exact at a bound, else the bracket's two ends. A p99
needs about a thousand requests to mean anything (minutes of traffic, not one 30 s cycle), so the
windows of recent cycles are added up over `slo_window_s` and the window's request count is
exported beside the ratio.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from exporter.collector.vllm_metrics import HistogramName
from exporter.sizing.slo_targets import PredictedPercentile
from model import LatencyMetric, PercentileTarget
from model.calibration.histogram import WindowHistogram

S_PER_MS = 1e-3
# A target within this relative distance of a bucket bound is taken as that bound (500 ms and
# le="0.5" are the same value, up to float rounding of ms -> s).
BOUND_TOLERANCE = 1e-9
# Below this many requests in the window a tail attainment is noise: no correction from it.
MIN_WINDOW_REQUESTS = 1000
# A larger shortfall means the model is wrong, not biased (as the mean bias is bounded).
MAX_SHORTFALL = 0.5
# The histogram each kind of target is read from.
HISTOGRAMS: Mapping[LatencyMetric, HistogramName] = {
    LatencyMetric.TTFT: HistogramName.TTFT_S,
    LatencyMetric.ITL_PER_TOKEN: HistogramName.ITL_S,
    LatencyMetric.ITL_PER_REQUEST: HistogramName.REQUEST_TPOT_S,
}


class Bound(StrEnum):
    """Which end of an observed attainment a value is; exported label values."""

    EXACT = "exact"  # the target is a bucket bound
    LOWER = "lower"  # the share at the bucket bound below the target
    UPPER = "upper"  # the share at the bucket bound above it (1 above the highest bound)


@dataclass(frozen=True, slots=True)
class ObservedAttainment:
    """The share of observations within a target over the SLO window: exact when lower ==
    upper; `observations` counted (requests, or gaps for per-token ITL)."""

    target: PercentileTarget
    lower: float
    upper: float
    observations: float

    @property
    def exact(self) -> bool:
        return self.lower == self.upper

    def values(self) -> tuple[tuple[Bound, float], ...]:
        """(bound, share) pairs as exported."""
        if self.exact:
            return ((Bound.EXACT, self.lower),)
        return ((Bound.LOWER, self.lower), (Bound.UPPER, self.upper))


def attainment_bracket(hist: WindowHistogram, target_ms: float) -> tuple[float, float] | None:
    """[share at the bound at or below target_ms, share at the bound at or above it]; equal
    ends when the target is a bound. None without observations."""
    total = float(hist.counts.sum())
    if total <= 0:
        return None
    target_s = target_ms * S_PER_MS
    bounds = hist.bounds
    k = int(np.searchsorted(bounds, target_s, side="left"))  # first bound >= target
    if k < bounds.size and math.isclose(bounds[k], target_s, rel_tol=BOUND_TOLERANCE):
        share = hist.share_at_most(float(bounds[k]))
        assert share is not None
        return share, share
    if k > 0 and math.isclose(bounds[k - 1], target_s, rel_tol=BOUND_TOLERANCE):
        share = hist.share_at_most(float(bounds[k - 1]))
        assert share is not None
        return share, share
    lower = hist.share_at_most(target_s)
    upper = 1.0 if k >= bounds.size else hist.share_at_most(float(bounds[k]))
    assert lower is not None and upper is not None
    return lower, upper


def interpolated_share(hist: WindowHistogram, target_ms: float) -> float | None:
    """The share of observations within target_ms as Prometheus' histogram_quantile reads a
    histogram: linear between the bracket's two ends, by where the target lies in its bucket
    (the bracket's upper end above the highest bound). None without observations."""
    bracket = attainment_bracket(hist, target_ms)
    if bracket is None or bracket[0] == bracket[1]:
        return None if bracket is None else bracket[0]
    lower, upper = bracket
    target_s = target_ms * S_PER_MS
    k = int(np.searchsorted(hist.bounds, target_s, side="left"))
    if k >= hist.bounds.size:
        return upper
    below = float(hist.bounds[k - 1]) if k > 0 else 0.0
    at = (target_s - below) / (float(hist.bounds[k]) - below)
    return lower + at * (upper - lower)


def added_up(windows: Sequence[WindowHistogram]) -> WindowHistogram | None:
    """The windows' histograms (oldest first) added up; those whose bounds differ from the
    newest are left out. None without any."""
    if not windows:
        return None
    acc = windows[-1]
    for hist in windows[-2::-1]:
        if hist.same_bounds(acc):
            acc = acc + hist
    return acc


@dataclass(slots=True)
class _Cycle:
    """One cycle's histograms and the model's attainment at that cycle's load."""

    end_s: float
    histograms: Mapping[HistogramName, WindowHistogram]
    predicted: dict[PercentileTarget, float] = field(default_factory=dict)


class SloWindow:
    """The latency histograms of the cycles within the last `window_s` seconds, added up, and
    the model's attainment at each cycle's load."""

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._cycles: deque[_Cycle] = deque()

    def add(self, end_s: float, windows: Mapping[HistogramName, WindowHistogram]) -> None:
        """One cycle's histograms, its window ending at end_s (s)."""
        wanted = {name: windows[name] for name in HISTOGRAMS.values() if name in windows}
        self._cycles.append(_Cycle(end_s, wanted))
        while self._cycles and self._cycles[0].end_s <= end_s - self._window_s:
            self._cycles.popleft()

    def predicted(self, end_s: float, percentiles: Sequence[PredictedPercentile]) -> None:
        """The model's attainment at the load of the cycle whose window ended at end_s."""
        if self._cycles and self._cycles[-1].end_s == end_s:
            self._cycles[-1].predicted.update({p.target: p.attainment for p in percentiles})

    def total(self, name: HistogramName) -> WindowHistogram | None:
        """The window's histogram; cycles whose bounds differ from the newest are left out."""
        return added_up([c.histograms[name] for c in self._cycles if name in c.histograms])

    def attainment(self, targets: Sequence[PercentileTarget]) -> tuple[ObservedAttainment, ...]:
        """Each target's observed attainment over the window (targets without observations are
        left out)."""
        out = []
        for target in targets:
            hist = self.total(HISTOGRAMS[target.metric])
            found = None if hist is None else attainment_bracket(hist, target.target_ms)
            if hist is not None and found is not None:
                out.append(ObservedAttainment(target, found[0], found[1], float(hist.count)))
        return tuple(out)

    def requests(self) -> float | None:
        """Requests that got their first token within the window (the TTFT count)."""
        hist = self.total(HistogramName.TTFT_S)
        return None if hist is None else float(hist.count)

    def shortfalls(self, targets: Sequence[PercentileTarget]) -> dict[PercentileTarget, float]:
        """Per target, how far the observed attainment falls below the model's, beyond the
        bracket: the model's mean attainment over the window's cycles (weighted by each cycle's
        observations) minus the bracket's upper end, where positive, at most MAX_SHORTFALL;
        nothing with fewer than MIN_WINDOW_REQUESTS requests."""
        requests = self.requests()
        if requests is None or requests < MIN_WINDOW_REQUESTS:
            return {}
        out: dict[PercentileTarget, float] = {}
        for seen in self.attainment(targets):
            name = HISTOGRAMS[seen.target.metric]
            pairs = [
                (c.histograms[name].count, c.predicted[seen.target])
                for c in self._cycles
                if name in c.histograms and seen.target in c.predicted
            ]
            weight = sum(w for w, _ in pairs)
            if weight <= 0:
                continue
            gap = sum(w * a for w, a in pairs) / weight - seen.upper
            if gap > 0:
                out[seen.target] = min(gap, MAX_SHORTFALL)
        return out
