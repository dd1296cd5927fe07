"""Integral action on observed attainment: a bounded capacity factor per deployment.

The model stays the feed-forward. When vLLM's latency histograms say a target is missed while
the model says the replicas meet it (bursts inside a window, a tail the model under-reads),
the sizer sizes for `factor` x the rate; the factor grows while misses persist and decays while
every target holds with margin. Windows in which a pod is loading or leaving, or whose load is
above the published capacity of the ready pods, are explained without the model being wrong:
they are not judged and do not feed the factor.

Why it does not oscillate:
- no wind-up: a verdict is drawn only from windows observed under the current factor and on
  the current pods (the evidence is dropped at each change of either), so one persisting miss
  grows the factor once per judgement, not once per window of a stale SLO window;
- asymmetric: a miss grows it by 10-50 % as soon as there is evidence enough; a decay needs
  a whole SLO window held with margin and takes it down by DECAY only;
- hysteresis: between a miss (beyond the binomial noise of the allowed share) and a margin
  (at most half the allowed share; a mean at most MEAN_MARGIN of its target) the factor holds;
  and a decay never goes below the factor at which misses were last seen for FLOOR_MEMORY_S.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum, StrEnum

from exporter.collector.observations import DeploymentObservation, ObservationStatus
from exporter.collector.vllm_metrics import HistogramName
from exporter.config.values import SloConfig
from exporter.sizing.attainment import (
    HISTOGRAMS,
    added_up,
    attainment_bracket,
    interpolated_share,
)
from exporter.sizing.recommender import Decision
from model import PercentileTarget
from model.calibration.histogram import WindowHistogram

MS_PER_S = 1000.0
# The factor's step on a judged miss: 1 + GAIN x the relative excess (of the mean over its
# target, of the misses over those allowed), within [MIN_GROWTH, MAX_GROWTH].
GAIN = 0.5
MIN_GROWTH, MAX_GROWTH = 1.1, 1.5
DECAY = 0.92  # its step after a whole SLO window held with margin
MAX_FACTOR = 4.0  # beyond this the model is wrong, not biased: the tuner's problem
# A percentile target is judged once its window holds this many allowed misses (n x (1 - q)):
# 100 requests for a p95, 500 gaps for a p99.
MIN_ALLOWED_MISSES = 5.0
MIN_MEAN_COUNT = 200.0  # observations before a mean target is judged
# A miss: observed misses beyond the allowed count by this many binomial standard deviations,
# or a mean above its target by MEAN_TOLERANCE.
MISS_SIGMAS = 1.5
MEAN_TOLERANCE = 0.05
# Held with margin: at most this share of the allowed misses, or a mean within MEAN_MARGIN.
MARGIN_SHARE = 0.5
MEAN_MARGIN = 0.8
FLOOR_MEMORY_S = 3600.0  # how long a decay stays above the factor of the last misses


class HeadroomReason(StrEnum):
    """Why the headroom factor is what it is; exported label values."""

    NO_MISS = "no_miss"  # at 1: no target missed beyond the model
    GREW = "misses_persist"  # misses observed under the current factor: it grew
    HOLDING = "holding"  # met without margin, or evidence still gathering
    DECAYED = "held_with_margin"  # a whole SLO window held with margin: it decayed
    POD_LOADING = "pod_loading"  # the window was not judged: a pod loading or leaving
    OVER_CAPACITY = "load_above_capacity"  # not judged: load above the published capacity
    NO_HISTOGRAMS = "no_histograms"  # not judged: no latency histogram to read


@dataclass(frozen=True, slots=True)
class Headroom:
    """The capacity factor sized with (>= 1: the rate sized for is multiplied by it)."""

    factor: float
    reason: HeadroomReason


class Verdict(Enum):
    """One target over the evidence."""

    UNKNOWN = 0  # too few observations
    MISS = 1
    MET = 2
    MARGIN = 3


@dataclass(frozen=True, slots=True)
class MeanTarget:
    """A mean target read from a histogram's exact sum and count."""

    histogram: HistogramName
    target_ms: float


def judged_targets(slo: SloConfig) -> tuple[MeanTarget | PercentileTarget, ...]:
    """The targets the headroom judges: the means (TTFT, per-token ITL) and the percentiles."""
    means = (
        MeanTarget(name, target)
        for name, target in ((HistogramName.TTFT_S, slo.ttft_ms), (HistogramName.ITL_S, slo.itl_ms))
        if target is not None
    )
    return (*means, *slo.percentiles)


def verdict(target: MeanTarget | PercentileTarget, hist: WindowHistogram) -> tuple[Verdict, float]:
    """Whether the observations in `hist` miss, meet or meet with margin one target, and by
    how much a miss exceeds it (relative; 0 otherwise)."""
    if isinstance(target, MeanTarget):
        if hist.count < MIN_MEAN_COUNT:
            return Verdict.UNKNOWN, 0.0
        excess = hist.sum / hist.count * MS_PER_S / target.target_ms - 1.0
        if excess > MEAN_TOLERANCE:
            return Verdict.MISS, excess
        return (Verdict.MARGIN if excess <= MEAN_MARGIN - 1.0 else Verdict.MET), 0.0
    allowed = hist.count * (1.0 - target.quantile)
    bracket = attainment_bracket(hist, target.target_ms)
    if allowed < MIN_ALLOWED_MISSES or bracket is None:
        return Verdict.UNKNOWN, 0.0
    lower, upper = bracket
    # The misses as a dashboard's histogram_quantile reads them: linear inside the target's
    # bucket. The fewest the buckets allow (above the bound over the target) would never see
    # a tail that stays inside it (per-token gaps of 40-50 ms against a 40 ms target).
    read = interpolated_share(hist, target.target_ms)
    assert read is not None
    misses = hist.count * (1.0 - read)
    if misses > allowed + MISS_SIGMAS * math.sqrt(allowed):
        return Verdict.MISS, misses / allowed - 1.0
    # ... and the most (above the bound under it).
    margin = hist.count * (1.0 - lower) <= MARGIN_SHARE * allowed
    return (Verdict.MARGIN if margin else Verdict.MET), 0.0


def excuse(
    obs: DeploymentObservation, desired: int | None, capacity_rps: float | None
) -> HeadroomReason | None:
    """Why this window's misses say nothing of the model (None: they do): a pod joined, left
    or is still loading (fewer ready than last asked for), or the load was above the last
    published per-replica capacity x the ready pods."""
    if obs.status not in (ObservationStatus.OK, ObservationStatus.NO_LATENCY):
        return HeadroomReason.NO_HISTOGRAMS
    if obs.new_pods or obs.gone_pods:
        return HeadroomReason.POD_LOADING
    if desired is not None and desired > obs.ready_pods:
        return HeadroomReason.POD_LOADING
    if capacity_rps is not None and obs.arrival_rate_rps > capacity_rps * obs.ready_pods:
        return HeadroomReason.OVER_CAPACITY
    return None


class HeadroomController:
    """One deployment's headroom factor, judged from its windows' latency histograms."""

    def __init__(self, slo: SloConfig) -> None:
        self._window_s = slo.window_s
        self._targets = judged_targets(slo)
        self._names = {_histogram(t) for t in self._targets}
        # (end s, histograms) of the windows judged since the factor or the pods last changed.
        self._evidence: deque[tuple[float, Mapping[HistogramName, WindowHistogram]]] = deque()
        self._margin_s = 0.0  # seconds judged with margin in a row since the factor changed
        self._floor, self._floor_s = 1.0, -math.inf
        self.state = Headroom(1.0, HeadroomReason.NO_MISS)

    def observe(self, obs: DeploymentObservation, last: Decision | None) -> Headroom:
        """Judge one window (`last`: the decision before it, whose count and per-replica
        capacity were published) and return the factor to size with."""
        factor = self.state.factor
        reason = excuse(
            obs,
            None if last is None else last.desired_replicas,
            None if last is None else last.sizing_capacity_rps,
        )
        windows = {n: obs.windows[n] for n in self._names if n in obs.windows}
        if reason is None and not windows:
            reason = HeadroomReason.NO_HISTOGRAMS
        if reason is HeadroomReason.POD_LOADING:
            self._evidence.clear()  # another fleet: its windows say nothing of the next one
        if reason is not None:
            self.state = Headroom(factor, reason)
            return self.state
        now_s = obs.end_time_s
        self._evidence.append((now_s, windows))
        while self._evidence and self._evidence[0][0] <= now_s - self._window_s:
            self._evidence.popleft()
        judged = [verdict(t, h) for t in self._targets if (h := self._total(_histogram(t)))]
        found = [v for v, _ in judged]
        margin = bool(found) and all(v is Verdict.MARGIN for v in found)
        if margin:
            self._margin_s += obs.window_s
        elif found and Verdict.UNKNOWN not in found:
            self._margin_s = 0.0
        if Verdict.MISS in found and factor < MAX_FACTOR:
            self._floor, self._floor_s = factor, now_s
            excess = max(e for _, e in judged)
            step = min(max(1.0 + GAIN * excess, MIN_GROWTH), MAX_GROWTH)
            self._change(min(factor * step, MAX_FACTOR), HeadroomReason.GREW)
        elif margin and factor > 1.0 and self._margin_s >= self._window_s * (1.0 - 1e-9):
            floor = self._floor if now_s - self._floor_s < FLOOR_MEMORY_S else 1.0
            self._change(max(factor * DECAY, floor, 1.0), HeadroomReason.DECAYED)
        else:
            held = HeadroomReason.HOLDING if factor > 1.0 else HeadroomReason.NO_MISS
            self.state = Headroom(factor, held)
        return self.state

    def _change(self, factor: float, reason: HeadroomReason) -> None:
        self._evidence.clear()
        self._margin_s = 0.0
        self.state = Headroom(factor, reason)

    def _total(self, name: HistogramName) -> WindowHistogram | None:
        """The evidence's histogram (windows whose bounds differ from the newest left out)."""
        return added_up([w[name] for _, w in self._evidence if name in w])


def _histogram(target: MeanTarget | PercentileTarget) -> HistogramName:
    return target.histogram if isinstance(target, MeanTarget) else HISTOGRAMS[target.metric]
