"""Two reads (window start, end) -> one deployment's observation over its pods. collector-spec §10.

Each pod seen OK in both reads gives a pod observation (exporter.collector.pod_observation); the
deployment's rates are summed over pods, its means weighted by their counts (sum of sums over
sum of counts), so an idle pod adds throughput but no latency. Windowed histograms are added
over pods with the same bucket bounds (a pod with other bounds is left out of them and flagged);
the prefix-cache hit ratio is hit tokens over looked-up tokens of all pods; the KV capacity is
the smallest pod's; the KV tokens held and the requests running at the window's end are summed
over the pods that read both (their ratio is a running request's mean context). A window
without completions has no latency observation (None), never zeros.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from exporter.collector.counter_trust import CounterTrust
from exporter.collector.pod_observation import (
    MS_PER_S,
    Continuity,
    PodObservation,
    Problem,
    continuity,
    histogram_mean,
    implausible,
    observe_pod,
)
from exporter.collector.saturation import Saturation
from exporter.collector.sources import PodFailure, SourceRead
from exporter.collector.vllm_metrics import (
    GaugeName,
    HistogramName,
    HistogramTotals,
    PodSample,
    SampleStatus,
)
from model.calibration.histogram import WindowHistogram
from model.calibration.kv_context import KvContext

logger = logging.getLogger(__name__)


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
class DeploymentObservation:
    """One deployment over one window: summed rates (req/s), count-weighted means (tokens, ms)."""

    success: bool
    status: ObservationStatus
    message: str
    deployment: str
    window_s: float
    end_time_s: float
    ready_pods: int  # pods known to exist: read, or failed to read, at the window's end
    observed_pods: int  # pods with a usable delta over the window
    unobserved_pods: int = 0  # known pods without one (failed read, untrustworthy counters)
    arrival_rate_rps: float  # the observed pods' sum, scaled up for the unobserved ones
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
    # Requests running or waiting at the window's end, summed over the pods read (None when a
    # pod lacks either gauge): what scale to zero waits to see at 0.
    requests_in_flight: float | None = None
    skipped_lines: int = 0  # unparseable exposition lines in the end read, all pods
    rejected_samples: int = 0  # NaN/Inf/negative/mistyped samples in the end read, all pods
    windows: Mapping[HistogramName, WindowHistogram] = field(default_factory=dict)
    cached_prompt_ratio: float | None = None  # prompt tokens served from the prefix cache
    kv_capacity_tokens: float | None = None  # per pod, the smallest: num_gpu_blocks x block_size
    kv_context: KvContext | None = None  # at the window's end, summed over pods

    def __post_init__(self) -> None:
        object.__setattr__(self, "windows", MappingProxyType(dict(self.windows)))

    @property
    def read_pods(self) -> int:
        """Pods whose metrics were read at the window's end."""
        return self.ready_pods - len({f.pod for f in self.failures})

    @property
    def arrival_rate_per_pod_rps(self) -> float | None:
        """Mean arrival rate per pod (req/s); None without an observed pod."""
        if not self.observed_pods:
            return None
        return self.arrival_rate_rps / (self.observed_pods + self.unobserved_pods)


def observe_deployment(
    start: SourceRead,
    end: SourceRead,
    *,
    deployment: str = "",
    distrusted: frozenset[str] = frozenset(),
) -> DeploymentObservation:
    """Two reads of one deployment -> its observation over (start.time_s, end.time_s];
    `distrusted` pods' windows are unusable, as are those whose counters fell or count more
    than their gauges make plausible."""
    before = {s.pod: s for s in start.samples if s.ok}
    after = {s.pod: s for s in end.samples if s.ok}
    problems: set[Problem] = set()
    pods: list[PodObservation] = []
    unusable: list[str] = []  # pods read at both ends whose counters cannot be trusted
    for pod in sorted(after.keys() & before.keys()):
        if after[pod].time_s > before[pod].time_s:
            if (
                pod in distrusted
                or continuity(before[pod], after[pod]) is Continuity.INCONSISTENT
                or implausible(before[pod], after[pod])
            ):
                unusable.append(pod)
            else:
                pods.append(observe_pod(before[pod], after[pod]))
    if unusable:
        problems.add(Problem.COUNTERS_INCONSISTENT)
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
    windows, mismatched = _sum_windows(pods)
    if mismatched:
        problems.add(Problem.BAD_BUCKETS)
    hits = [p.cache_hits for p in pods if p.cache_hits is not None]
    queried = sum(h.queried_tokens for h in hits)
    capacities = [p.kv_capacity_tokens for p in pods if p.kv_capacity_tokens is not None]
    # Pods known to exist (they answered, or a read of them failed) but without a usable delta
    # still serve traffic: their load is estimated from the observed pods' mean, never zero.
    failed = {f.pod for f in end.failures} - after.keys()
    # A pod answering again after failed reads has no window start yet, but has served all
    # along: unobserved, not new (a new pod's load starts at its first window).
    recovered = (after.keys() - before.keys()) & {f.pod for f in start.failures}
    unobserved = len(unusable) + len(failed) + len(recovered)
    scale = (len(pods) + unobserved) / len(pods) if pods else 1.0
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
        ready_pods=len(after) + len(failed),
        observed_pods=len(pods),
        unobserved_pods=unobserved,
        arrival_rate_rps=scale * sum(p.arrival_rate_rps for p in pods),
        completion_rate_rps=scale * sum(p.completion_rate_rps for p in pods),
        backlog_change=scale * sum(p.backlog_change or 0.0 for p in pods),
        avg_input_tokens=histogram_mean(sums.get(HistogramName.PROMPT_LEN)),
        avg_output_tokens=histogram_mean(sums.get(HistogramName.GENERATION_LEN)),
        ttft_ms=histogram_mean(sums.get(HistogramName.TTFT_S), MS_PER_S),
        itl_ms=histogram_mean(sums.get(HistogramName.ITL_S), MS_PER_S),
        request_tpot_ms=histogram_mean(sums.get(HistogramName.REQUEST_TPOT_S), MS_PER_S),
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
        requests_in_flight=_in_flight(after.values()),
        skipped_lines=sum(s.skipped_lines for s in end.samples),
        rejected_samples=sum(s.rejected_samples for s in end.samples),
        windows=windows,
        cached_prompt_ratio=sum(h.hit_tokens for h in hits) / queried if queried > 0 else None,
        kv_capacity_tokens=min(capacities) if capacities else None,
        kv_context=_sum_kv_contexts(pods),
    )


# Consecutive windows with inconsistent counters before the load-balancer warning.
INCONSISTENT_WARN_AFTER = 2


class WindowTracker:
    """Keeps the previous read of one deployment so each new read closes a window; a pod whose
    counters fell starts its windows from its high-water mark (exporter.collector.counter_trust)."""

    def __init__(self, deployment: str = "") -> None:
        self._deployment = deployment
        self._previous: SourceRead | None = None
        self._trust = CounterTrust()
        self._inconsistent = 0  # windows in a row with counters that cannot be trusted

    @property
    def primed(self) -> bool:
        """True once a read has been seen, so the next one closes a window."""
        return self._previous is not None

    @property
    def last_read_s(self) -> float | None:
        """When the read that opens the next window was taken (s); None before the first."""
        return None if self._previous is None else self._previous.time_s

    def observe(
        self, read: SourceRead, fell: frozenset[str] = frozenset()
    ) -> DeploymentObservation:
        """The observation from the previous read to `read` (WARMING_UP on the first); `fell`
        names pods whose counters another reader saw fall within the window."""
        previous = self._trust.bases(self._previous or SourceRead(time_s=read.time_s, samples=()))
        self._previous = read
        distrusted = self._trust.update(previous, read, fell)
        obs = observe_deployment(previous, read, deployment=self._deployment, distrusted=distrusted)
        if Problem.COUNTERS_INCONSISTENT in obs.problems:
            self._inconsistent += 1
            if self._inconsistent == INCONSISTENT_WARN_AFTER:
                logger.warning(
                    "%s: counters went down without a restart in %d windows in a row: is this "
                    "URL a load-balanced Service? Scrape the headless Service (one address per "
                    "pod) instead",
                    self._deployment,
                    self._inconsistent,
                )
        else:
            self._inconsistent = 0
        return obs


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


def _in_flight(samples: Iterable[PodSample]) -> float | None:
    total = 0.0
    for sample in samples:
        backlog = [sample.gauges.get(name) for name in (GaugeName.RUNNING, GaugeName.WAITING)]
        if None in backlog:
            return None
        total += sum(v for v in backlog if v is not None)
    return total


def _sum_kv_contexts(pods: list[PodObservation]) -> KvContext | None:
    contexts = [p.kv_context for p in pods if p.kv_context is not None]
    return sum(contexts, KvContext(0.0, 0.0)) if contexts else None


def _sum_deltas(pods: list[PodObservation]) -> dict[HistogramName, HistogramTotals]:
    sums: dict[HistogramName, HistogramTotals] = {}
    for pod in pods:
        for name, d in pod.deltas.items():
            acc = sums.get(name, HistogramTotals(0.0, 0.0))
            sums[name] = HistogramTotals(acc.sum + d.sum, acc.count + d.count)
    return sums


def _sum_windows(
    pods: list[PodObservation],
) -> tuple[dict[HistogramName, WindowHistogram], bool]:
    """Each windowed histogram added over the pods; a pod whose bounds differ from the first
    pod's is left out (True: some pod was)."""
    sums: dict[HistogramName, WindowHistogram] = {}
    mismatched = False
    for pod in pods:
        for name, window in pod.windows.items():
            acc = sums.get(name)
            if acc is None:
                sums[name] = window
            elif acc.same_bounds(window):
                sums[name] = acc + window
            else:
                mismatched = True
    return sums, mismatched
