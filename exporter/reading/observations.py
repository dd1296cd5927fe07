"""Two reads (window start, end) -> pod and deployment observations. collector-spec §7.4, §10.

Per pod, over the window W between its two samples:
- completions C = increase of `request_success_total` (all `finished_reason`s);
- arrival rate = (C + N_end - N_start) / W with N = running + waiting, clamped to >= the
  completion rate (spec §7.4: vLLM has no arrival counter, completions undercount under load);
- means from histogram `_sum`/`_count` increases: input/output tokens per completed request,
  TTFT and ITL (s -> ms); running and waiting by Little's law from the inference- and
  queue-time histograms (time-averages over W), else the mean of the two gauge readings.
A decrease of any cumulative value, or a new process start time, is a restart: every value is
counted from zero, as Prometheus `rate()` does. Deployment level: rates summed over pods, means
weighted by their counts (sum of sums over sum of counts), so an idle pod adds throughput but no
latency. A window without completions has no latency observation (None), never zeros.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from exporter.reading.sources import PodFailure, SourceRead
from exporter.reading.vllm_metrics import (
    CounterName,
    GaugeName,
    HistogramName,
    HistogramTotals,
    PodSample,
    SampleStatus,
)

logger = logging.getLogger(__name__)

MS_PER_S = 1000.0
# λ̂ above this multiple of the completion rate means the backlog grows (spec §7.4).
QUEUE_GROWTH_FACTOR = 1.1
# ... and by at least this many requests, so one arrival at an idle pod is not "growing".
MIN_BACKLOG_GROWTH = 2.0
# Saturation thresholds of collector-spec §8 (the WVA's KV threshold is 0.80; vLLM preempts
# near full, so 0.95 marks real exhaustion).
SATURATED_WAITING = 0.5
SATURATED_KV_RATIO = 0.95
# Process start times differ by more than this (s) => a different process, hence a reset.
PROCESS_START_TOLERANCE_S = 1.0


class Problem(StrEnum):
    """Why part of an observation is missing or degraded; values are exported label values."""

    COUNTER_RESET = "counter_reset"
    NO_COMPLETIONS = "no_completions"
    MISSING_GAUGES = "missing_gauges"
    MISSING_LATENCY = "missing_latency"
    NEW_POD = "new_pod"
    GONE_POD = "gone_pod"
    FAILED_POD = "failed_pod"
    MODEL_NOT_FOUND = "model_not_found"
    BAD_POD_SAMPLE = "bad_pod_sample"


class Saturation(StrEnum):
    """Signs that a window ran saturated (collector-spec §8); exported label values."""

    WAITING = "waiting"  # mean waiting requests > 0.5
    BACKLOG_GROWING = "backlog_growing"  # queue_growing
    QUEUE_OVER_INFERENCE = "queue_over_inference"  # mean queue time > mean inference time
    KV_FULL = "kv_full"  # KV-cache usage > 0.95 at the window end
    PREEMPTIONS = "preemptions"  # any preemption in the window


class ObservationStatus(StrEnum):
    """The verdict on one deployment's window; values are exported label values."""

    OK = "ok"
    NO_LATENCY = "no_latency"
    WARMING_UP = "warming_up"
    NO_PODS = "no_pods"
    MODEL_NOT_FOUND = "model_not_found"


STATUS_MESSAGES: Mapping[ObservationStatus, str] = MappingProxyType(
    {
        ObservationStatus.OK: "rates and latencies observed",
        ObservationStatus.NO_LATENCY: "no request completed in the window: rates only",
        ObservationStatus.WARMING_UP: "no pod has two samples yet",
        ObservationStatus.NO_PODS: "no pod gave a usable sample",
        ObservationStatus.MODEL_NOT_FOUND: "no pod exposes the configured model_name",
    }
)
_USABLE = frozenset({ObservationStatus.OK, ObservationStatus.NO_LATENCY})


@dataclass(frozen=True, slots=True, kw_only=True)
class PodObservation:
    """One pod over one window: rates (req/s), means (tokens, ms, requests), flags."""

    pod: str
    window_s: float
    completed: float
    arrival_rate_rps: float
    completion_rate_rps: float
    backlog_change: float | None
    avg_input_tokens: float | None
    avg_output_tokens: float | None
    ttft_ms: float | None
    itl_ms: float | None
    request_tpot_ms: float | None
    avg_running: float | None
    avg_waiting: float | None
    kv_cache_usage_ratio: float | None
    queue_growing: bool
    reset: bool
    problems: tuple[Problem, ...]
    deltas: Mapping[HistogramName, HistogramTotals] = field(default_factory=dict)
    saturation: tuple[Saturation, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "deltas", MappingProxyType(dict(self.deltas)))


@dataclass(frozen=True, slots=True, kw_only=True)
class DeploymentObservation:
    """One deployment over one window: summed rates (req/s), count-weighted means (tokens, ms)."""

    success: bool
    status: ObservationStatus
    message: str
    deployment: str
    window_s: float
    end_time_s: float
    ready_pods: int
    observed_pods: int
    arrival_rate_rps: float
    completion_rate_rps: float
    backlog_change: float
    avg_input_tokens: float | None
    avg_output_tokens: float | None
    ttft_ms: float | None
    itl_ms: float | None
    request_tpot_ms: float | None
    avg_running_per_pod: float | None
    avg_waiting_per_pod: float | None
    kv_cache_usage_ratio: float | None
    max_kv_cache_usage_ratio: float | None
    queue_growing: bool
    pods: tuple[PodObservation, ...]
    new_pods: tuple[str, ...]
    gone_pods: tuple[str, ...]
    failures: tuple[PodFailure, ...]
    problems: tuple[Problem, ...]
    saturation: tuple[Saturation, ...] = ()  # every sign seen on any observed pod
    skipped_lines: int = 0  # unparseable exposition lines in the end read, all pods
    rejected_samples: int = 0  # NaN/Inf/negative/mistyped samples in the end read, all pods

    @property
    def arrival_rate_per_pod_rps(self) -> float | None:
        """Mean arrival rate of the pods that have a delta (req/s); None without any."""
        return self.arrival_rate_rps / self.observed_pods if self.observed_pods else None


def observe_pod(start: PodSample, end: PodSample) -> PodObservation:
    """Two OK samples of one pod -> its observation over (start.time_s, end.time_s]."""
    window_s = end.time_s - start.time_s
    if not window_s > 0:
        raise ValueError(f"`end.time_s` must be after `start.time_s`, got a window of {window_s} s")
    if not (start.ok and end.ok):
        raise ValueError(f"both samples must be OK, got {start.status} and {end.status}")
    reset = _is_reset(start, end)
    problems: list[Problem] = [Problem.COUNTER_RESET] if reset else []
    completed = _increase(start.counters, end.counters, CounterName.REQUEST_SUCCESS, reset)
    completed = 0.0 if completed is None else completed  # OK samples always carry it
    deltas = _histogram_deltas(start, end, reset)
    # Token fallback (biased on ramps, spec §7.3.8): counters over completions, only when the
    # per-request histograms are absent.
    for hist, counter in (
        (HistogramName.PROMPT_LEN, CounterName.PROMPT_TOKENS),
        (HistogramName.GENERATION_LEN, CounterName.GENERATION_TOKENS),
    ):
        tokens = _increase(start.counters, end.counters, counter, reset)
        if hist not in deltas and tokens is not None:
            deltas[hist] = HistogramTotals(tokens, completed)
    n_start = 0.0 if reset else _backlog(start)
    n_end = _backlog(end)
    backlog_change = None if n_start is None or n_end is None else n_end - n_start
    if backlog_change is None:
        problems.append(Problem.MISSING_GAUGES)
    arrivals = completed + max(backlog_change or 0.0, 0.0)
    if completed <= 0:
        problems.append(Problem.NO_COMPLETIONS)
    elif HistogramName.TTFT_S not in deltas or HistogramName.ITL_S not in deltas:
        problems.append(Problem.MISSING_LATENCY)
    avg_waiting = _occupancy(
        deltas, HistogramName.QUEUE_TIME_S, GaugeName.WAITING, start, end, window_s
    )
    kv = end.gauges.get(GaugeName.KV_USAGE)
    queue_growing = _growing(backlog_change, arrivals, completed)
    preempted = _increase(start.counters, end.counters, CounterName.PREEMPTIONS, reset)
    return PodObservation(
        pod=end.pod,
        window_s=window_s,
        completed=completed,
        arrival_rate_rps=arrivals / window_s,
        completion_rate_rps=completed / window_s,
        backlog_change=backlog_change,
        avg_input_tokens=_mean(deltas.get(HistogramName.PROMPT_LEN)),
        avg_output_tokens=_mean(deltas.get(HistogramName.GENERATION_LEN)),
        ttft_ms=_mean(deltas.get(HistogramName.TTFT_S), MS_PER_S),
        itl_ms=_mean(deltas.get(HistogramName.ITL_S), MS_PER_S),
        request_tpot_ms=_mean(deltas.get(HistogramName.REQUEST_TPOT_S), MS_PER_S),
        avg_running=_occupancy(
            deltas, HistogramName.INFERENCE_TIME_S, GaugeName.RUNNING, start, end, window_s
        ),
        avg_waiting=avg_waiting,
        kv_cache_usage_ratio=kv,
        queue_growing=queue_growing,
        reset=reset,
        problems=tuple(problems),
        deltas=deltas,
        saturation=_saturation(deltas, avg_waiting, queue_growing, kv, preempted),
    )


def observe_deployment(
    start: SourceRead, end: SourceRead, *, deployment: str = ""
) -> DeploymentObservation:
    """Two reads of one deployment -> its observation over (start.time_s, end.time_s]."""
    before = {s.pod: s for s in start.samples if s.ok}
    after = {s.pod: s for s in end.samples if s.ok}
    problems: set[Problem] = set()
    pods: list[PodObservation] = []
    for pod in sorted(after.keys() & before.keys()):
        if after[pod].time_s > before[pod].time_s:
            pods.append(observe_pod(before[pod], after[pod]))
    new_pods = tuple(sorted(after.keys() - before.keys()))
    gone_pods = tuple(sorted(before.keys() - after.keys()))
    bad = [s for s in end.samples if not s.ok]
    for flag, present in (
        (Problem.NEW_POD, new_pods),
        (Problem.GONE_POD, gone_pods),
        (Problem.FAILED_POD, end.failures),
        (Problem.BAD_POD_SAMPLE, [s for s in bad if s.status is not SampleStatus.MODEL_NOT_FOUND]),
        (Problem.MODEL_NOT_FOUND, [s for s in bad if s.status is SampleStatus.MODEL_NOT_FOUND]),
    ):
        if present:
            problems.add(flag)
    for pod_obs in pods:
        problems.update(pod_obs.problems)
    status = _status(pods, after, bad)
    if status is ObservationStatus.MODEL_NOT_FOUND:
        exposed = sorted({name for s in bad for name in s.model_names})
        logger.warning(
            "%s: the configured model_name matches no pod's vLLM series; pods expose: %s",
            deployment,
            ", ".join(exposed) or "(no model_name label)",
        )
    sums = _sum_deltas(pods)
    kv = [s.gauges[GaugeName.KV_USAGE] for s in after.values() if GaugeName.KV_USAGE in s.gauges]
    running = [p.avg_running for p in pods if p.avg_running is not None]
    waiting = [p.avg_waiting for p in pods if p.avg_waiting is not None]
    return DeploymentObservation(
        success=status in _USABLE,
        status=status,
        message=STATUS_MESSAGES[status],
        deployment=deployment,
        window_s=end.time_s - start.time_s,
        end_time_s=end.time_s,
        ready_pods=len(after),
        observed_pods=len(pods),
        arrival_rate_rps=sum(p.arrival_rate_rps for p in pods),
        completion_rate_rps=sum(p.completion_rate_rps for p in pods),
        backlog_change=sum(p.backlog_change or 0.0 for p in pods),
        avg_input_tokens=_mean(sums.get(HistogramName.PROMPT_LEN)),
        avg_output_tokens=_mean(sums.get(HistogramName.GENERATION_LEN)),
        ttft_ms=_mean(sums.get(HistogramName.TTFT_S), MS_PER_S),
        itl_ms=_mean(sums.get(HistogramName.ITL_S), MS_PER_S),
        request_tpot_ms=_mean(sums.get(HistogramName.REQUEST_TPOT_S), MS_PER_S),
        avg_running_per_pod=sum(running) / len(running) if running else None,
        avg_waiting_per_pod=sum(waiting) / len(waiting) if waiting else None,
        kv_cache_usage_ratio=sum(kv) / len(kv) if kv else None,
        max_kv_cache_usage_ratio=max(kv) if kv else None,
        queue_growing=any(p.queue_growing for p in pods),
        pods=tuple(pods),
        new_pods=new_pods,
        gone_pods=gone_pods,
        failures=end.failures,
        problems=tuple(sorted(problems)),
        saturation=tuple(sign for sign in Saturation if any(sign in p.saturation for p in pods)),
        skipped_lines=sum(s.skipped_lines for s in end.samples),
        rejected_samples=sum(s.rejected_samples for s in end.samples),
    )


class WindowTracker:
    """Keeps the previous read of one deployment so each new read closes a window."""

    def __init__(self, deployment: str = "") -> None:
        self._deployment = deployment
        self._previous: SourceRead | None = None

    @property
    def primed(self) -> bool:
        """True once a read has been seen, so the next one closes a window."""
        return self._previous is not None

    def observe(self, read: SourceRead) -> DeploymentObservation:
        """The observation from the previous read to `read` (WARMING_UP on the first)."""
        previous = self._previous or SourceRead(time_s=read.time_s, samples=())
        self._previous = read
        return observe_deployment(previous, read, deployment=self._deployment)


def _status(
    pods: list[PodObservation], after: Mapping[str, PodSample], bad: list[PodSample]
) -> ObservationStatus:
    if not after:
        if any(s.status is SampleStatus.MODEL_NOT_FOUND for s in bad):
            return ObservationStatus.MODEL_NOT_FOUND
        return ObservationStatus.NO_PODS
    if not pods:
        return ObservationStatus.WARMING_UP
    if sum(p.completed for p in pods) <= 0:
        return ObservationStatus.NO_LATENCY
    return ObservationStatus.OK


def _is_reset(start: PodSample, end: PodSample) -> bool:
    if start.process_start_s is not None and end.process_start_s is not None:
        if abs(end.process_start_s - start.process_start_s) > PROCESS_START_TOLERANCE_S:
            return True
    if any(end.counters[c] < v for c, v in start.counters.items() if c in end.counters):
        return True
    return any(
        end.histograms[h].count < t.count or end.histograms[h].sum < t.sum
        for h, t in start.histograms.items()
        if h in end.histograms
    )


def _increase(
    start: Mapping[CounterName, float],
    end: Mapping[CounterName, float],
    name: CounterName,
    reset: bool,
) -> float | None:
    if name not in end:
        return None
    if reset:
        return end[name]
    return end[name] - start[name] if name in start else None


def _histogram_deltas(
    start: PodSample, end: PodSample, reset: bool
) -> dict[HistogramName, HistogramTotals]:
    deltas: dict[HistogramName, HistogramTotals] = {}
    for name, totals in end.histograms.items():
        if reset:
            deltas[name] = totals
        elif name in start.histograms:
            first = start.histograms[name]
            deltas[name] = HistogramTotals(totals.sum - first.sum, totals.count - first.count)
    return deltas


def _sum_deltas(pods: list[PodObservation]) -> dict[HistogramName, HistogramTotals]:
    sums: dict[HistogramName, HistogramTotals] = {}
    for pod in pods:
        for name, d in pod.deltas.items():
            acc = sums.get(name, HistogramTotals(0.0, 0.0))
            sums[name] = HistogramTotals(acc.sum + d.sum, acc.count + d.count)
    return sums


def _mean(totals: HistogramTotals | None, scale: float = 1.0) -> float | None:
    """Sum over count times `scale`; None when nothing was observed (never a zero)."""
    if totals is None or totals.count <= 0:
        return None
    return scale * totals.sum / totals.count


def _backlog(sample: PodSample) -> float | None:
    running = sample.gauges.get(GaugeName.RUNNING)
    waiting = sample.gauges.get(GaugeName.WAITING)
    return None if running is None or waiting is None else running + waiting


def _occupancy(
    deltas: Mapping[HistogramName, HistogramTotals],
    phase: HistogramName,
    gauge: GaugeName,
    start: PodSample,
    end: PodSample,
    window_s: float,
) -> float | None:
    """Mean requests in a phase: time spent in it per second of window (Little), else gauges."""
    d = deltas.get(phase)
    if d is not None and d.count > 0:
        return d.sum / window_s
    if gauge in start.gauges and gauge in end.gauges:
        return 0.5 * (start.gauges[gauge] + end.gauges[gauge])
    return end.gauges.get(gauge)


def _growing(backlog_change: float | None, arrivals: float, completed: float) -> bool:
    if backlog_change is None or backlog_change < MIN_BACKLOG_GROWTH:
        return False
    return arrivals > QUEUE_GROWTH_FACTOR * completed


def _saturation(
    deltas: Mapping[HistogramName, HistogramTotals],
    avg_waiting: float | None,
    queue_growing: bool,
    kv: float | None,
    preempted: float | None,
) -> tuple[Saturation, ...]:
    """The collector-spec §8 signs present in one pod's window."""
    queue = _mean(deltas.get(HistogramName.QUEUE_TIME_S))
    inference = _mean(deltas.get(HistogramName.INFERENCE_TIME_S))
    signs = {
        Saturation.WAITING: avg_waiting is not None and avg_waiting > SATURATED_WAITING,
        Saturation.BACKLOG_GROWING: queue_growing,
        # An absent mean is no sign: the comparison is then False.
        Saturation.QUEUE_OVER_INFERENCE: (queue or 0.0) > (inference or math.inf),
        Saturation.KV_FULL: kv is not None and kv > SATURATED_KV_RATIO,
        Saturation.PREEMPTIONS: preempted is not None and preempted > 0,
    }
    return tuple(sign for sign, present in signs.items() if present)
