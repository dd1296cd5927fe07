"""One pod's observation over a window: counter and histogram deltas. collector-spec §7.4.

Over the window W between a pod's two samples:
- completions C = increase of `request_success_total` (all `finished_reason`s);
- arrival rate = (C + N_end - N_start) / W with N = running + waiting, clamped to >= the
  completion rate (spec §7.4: vLLM has no arrival counter, completions undercount under load);
- means from histogram `_sum`/`_count` increases: input/output tokens per completed request,
  TTFT and ITL (s -> ms); running and waiting by Little's law from the inference- and
  queue-time histograms (time-averages over W), else the mean of the two gauge readings.
- the windowed histograms of the bucketed histograms (exporter.collector.vllm_buckets), and the
  prompt tokens served from the prefix cache: `prompt_tokens_cached` over `prompt_tokens`, or
  (older vLLM) prefix-cache hits over queries;
- the KV tokens running requests hold at the window's end (KV usage times the cache's tokens)
  with the running requests read at the same instant (model.calibration.kv_context), unless
  the window preempted or filled the cache.
A decrease of any cumulative value, or a new process start time, is a restart: every value is
counted from zero, as Prometheus `rate()` does. A window without completions has no latency
observation (None), never zeros.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from exporter.collector.saturation import Saturation, backlog_growing, saturation_signs
from exporter.collector.vllm_buckets import bucket_delta
from exporter.collector.vllm_metrics import (
    CounterName,
    GaugeName,
    HistogramName,
    HistogramTotals,
    PodSample,
)
from model.calibration.histogram import WindowHistogram
from model.calibration.kv_context import KvContext

MS_PER_S = 1000.0
# Process start times differ by more than this (s) => a different process, hence a reset.
PROCESS_START_TOLERANCE_S = 1.0
# A restart is real only if the new process started after the window's first read, up to this
# much clock skew between the pod and the sizer (s).
PROCESS_CLOCK_SKEW_S = 30.0


class Continuity(StrEnum):
    """How two samples of one URL relate."""

    SAME_PROCESS = "same_process"  # counters only grew: the window's increase is usable
    RESTARTED = "restarted"  # a new process started inside the window: count from zero
    INCONSISTENT = "inconsistent"  # counters fell, or an older process answers: unusable


def same_process(start_s: float | None, other_s: float | None) -> bool:
    """Two reads' process start times (s) name one process: both known and within
    PROCESS_START_TOLERANCE_S."""
    return (
        start_s is not None
        and other_s is not None
        and abs(other_s - start_s) <= PROCESS_START_TOLERANCE_S
    )


def continuity(start: PodSample, end: PodSample) -> Continuity:
    """Whether the window between two samples of one URL can be read as one pod's increase.

    A decrease is a restart only when the process says so: vLLM exports
    process_start_time_seconds, and a restarted process started after the window's first read.
    Counters that fall while the process is the same, or a process start time that differs but
    lies before the window (two pods behind one load-balanced URL), make the window unusable
    rather than charging the end values to it. Without a start time, a decrease is a restart.
    """
    decreased = _decreased(start, end)
    if start.process_start_s is None or end.process_start_s is None:
        return Continuity.RESTARTED if decreased else Continuity.SAME_PROCESS
    if same_process(start.process_start_s, end.process_start_s):
        return Continuity.INCONSISTENT if decreased else Continuity.SAME_PROCESS
    if end.process_start_s >= start.time_s - PROCESS_CLOCK_SKEW_S:
        return Continuity.RESTARTED
    return Continuity.INCONSISTENT


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
    COUNTERS_INCONSISTENT = "counters_inconsistent"  # counters fell without a restart
    NON_STATIONARY = "non_stationary"  # the rate moved too much for the tuner to fit the window
    INVALID_OBSERVATION = "invalid_observation"  # the window's figures fail the tuner's checks
    BAD_BUCKETS = "bad_buckets"  # histogram buckets not monotone in le, or bounds changed
    SAMPLER_GAP = "sampler_gap"  # the 1 s arrival sampler missed or reset: no arrival CV


@dataclass(frozen=True, slots=True)
class CacheHits:
    """Prompt tokens served from the prefix cache out of those looked up, over a window."""

    hit_tokens: float
    queried_tokens: float


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
    windows: Mapping[HistogramName, WindowHistogram] = field(default_factory=dict)
    cache_hits: CacheHits | None = None
    kv_capacity_tokens: float | None = None  # at the window's end
    kv_context: KvContext | None = None  # at the window's end

    def __post_init__(self) -> None:
        object.__setattr__(self, "deltas", MappingProxyType(dict(self.deltas)))
        object.__setattr__(self, "windows", MappingProxyType(dict(self.windows)))


def observe_pod(start: PodSample, end: PodSample) -> PodObservation:
    """Two OK samples of one pod -> its observation over (start.time_s, end.time_s]; the
    caller has checked that their `continuity` is not INCONSISTENT."""
    window_s = end.time_s - start.time_s
    if not window_s > 0:
        raise ValueError(f"`end.time_s` must be after `start.time_s`, got a window of {window_s} s")
    if not (start.ok and end.ok):
        raise ValueError(f"both samples must be OK, got {start.status} and {end.status}")
    reset = continuity(start, end) is Continuity.RESTARTED
    problems: list[Problem] = [Problem.COUNTER_RESET] if reset else []
    completed = _increase(start.counters, end.counters, CounterName.REQUEST_SUCCESS, reset)
    completed = 0.0 if completed is None else completed  # OK samples always carry it
    deltas = _histogram_deltas(start, end, reset)
    windows = _bucket_windows(start, end, reset, deltas)
    readable = [n for n in end.buckets if n in deltas and (reset or n in start.buckets)]
    if end.bad_buckets or len(windows) < len(readable):
        problems.append(Problem.BAD_BUCKETS)
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
    queue_growing = backlog_growing(backlog_change, arrivals)
    preempted = _increase(start.counters, end.counters, CounterName.PREEMPTIONS, reset)
    saturation = saturation_signs(
        histogram_mean(deltas.get(HistogramName.QUEUE_TIME_S)),
        histogram_mean(deltas.get(HistogramName.INFERENCE_TIME_S)),
        avg_waiting,
        queue_growing,
        kv,
        preempted,
    )
    return PodObservation(
        pod=end.pod,
        window_s=window_s,
        completed=completed,
        arrival_rate_rps=arrivals / window_s,
        completion_rate_rps=completed / window_s,
        backlog_change=backlog_change,
        avg_input_tokens=histogram_mean(deltas.get(HistogramName.PROMPT_LEN)),
        avg_output_tokens=histogram_mean(deltas.get(HistogramName.GENERATION_LEN)),
        ttft_ms=histogram_mean(deltas.get(HistogramName.TTFT_S), MS_PER_S),
        itl_ms=histogram_mean(deltas.get(HistogramName.ITL_S), MS_PER_S),
        request_tpot_ms=histogram_mean(deltas.get(HistogramName.REQUEST_TPOT_S), MS_PER_S),
        avg_running=_occupancy(
            deltas, HistogramName.INFERENCE_TIME_S, GaugeName.RUNNING, start, end, window_s
        ),
        avg_waiting=avg_waiting,
        kv_cache_usage_ratio=kv,
        queue_growing=queue_growing,
        reset=reset,
        problems=tuple(problems),
        deltas=deltas,
        saturation=saturation,
        windows=windows,
        cache_hits=_cache_hits(start, end, reset),
        kv_capacity_tokens=end.kv_capacity_tokens,
        kv_context=_kv_context(end, saturation),
    )


# Little's law gives a window's mean requests in flight as completions x mean lifetime / window;
# more than this many times what the running and waiting gauges showed at either end (plus one)
# is no burst between two reads but counters that lie (a duplicated series, a corrupted pod).
# Wide on purpose: gauges are two instants of a window, and a clock that runs faster than the
# reads' stamps (a stepped test bed: 30 s of serving between reads 0.4 s apart) reads ~10^3;
# counters that lie read 10^10 and more.
PLAUSIBLE_IN_FLIGHT_FACTOR = 1e4


def implausible(start: PodSample, end: PodSample) -> bool:
    """True when the window's completions need far more requests in flight than the pod's
    gauges make plausible (PLAUSIBLE_IN_FLIGHT_FACTOR); False whenever a figure is missing."""
    window_s = end.time_s - start.time_s
    held = [_backlog(start), _backlog(end)]
    if window_s <= 0 or None in held or continuity(start, end) is Continuity.RESTARTED:
        return False
    success = CounterName.REQUEST_SUCCESS
    completed = end.counters.get(success, 0.0) - start.counters.get(success, 0.0)
    lifetime_s = 0.0
    for phase in (HistogramName.QUEUE_TIME_S, HistogramName.INFERENCE_TIME_S):
        a, b = start.histograms.get(phase), end.histograms.get(phase)
        if a is not None and b is not None and b.count > a.count:
            lifetime_s += (b.sum - a.sum) / (b.count - a.count)
    in_flight = completed * lifetime_s / window_s
    return in_flight > PLAUSIBLE_IN_FLIGHT_FACTOR * (1.0 + max(h or 0.0 for h in held))


def _decreased(start: PodSample, end: PodSample) -> bool:
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


def _bucket_windows(
    start: PodSample,
    end: PodSample,
    reset: bool,
    deltas: Mapping[HistogramName, HistogramTotals],
) -> dict[HistogramName, WindowHistogram]:
    """The window's histogram of each bucketed histogram read at both ends (or since a
    restart); bounds that changed or buckets that fell give none."""
    windows: dict[HistogramName, WindowHistogram] = {}
    for name, buckets in end.buckets.items():
        totals = deltas.get(name)
        if totals is None:
            continue
        window = bucket_delta(
            start.buckets.get(name),
            buckets,
            reset=reset,
            sum_delta=totals.sum,
            count_delta=totals.count,
        )
        if window is not None:
            windows[name] = window
    return windows


def _cache_hits(start: PodSample, end: PodSample, reset: bool) -> CacheHits | None:
    """Cached prompt tokens over all prompt tokens in the window; else prefix-cache hits over
    queries (older vLLM); None when neither pair was read or nothing was looked up."""
    for hits, of in (
        (CounterName.PROMPT_TOKENS_CACHED, CounterName.PROMPT_TOKENS),
        (CounterName.PREFIX_CACHE_HITS, CounterName.PREFIX_CACHE_QUERIES),
    ):
        hit = _increase(start.counters, end.counters, hits, reset)
        total = _increase(start.counters, end.counters, of, reset)
        if hit is not None and total is not None and total > 0:
            return CacheHits(min(max(hit, 0.0), total), total)
    return None


def _kv_context(end: PodSample, saturation: tuple[Saturation, ...]) -> KvContext | None:
    """KV tokens held and requests running at the window's end; None when a gauge or the
    capacity is missing, or the window preempted or filled the cache (a preempted request
    frees its KV and recomputes it: the running set is then not the steady one)."""
    kv = end.gauges.get(GaugeName.KV_USAGE)
    running = end.gauges.get(GaugeName.RUNNING)
    capacity = end.kv_capacity_tokens
    if kv is None or running is None or capacity is None:
        return None
    if Saturation.PREEMPTIONS in saturation or Saturation.KV_FULL in saturation:
        return None
    return KvContext(kv * capacity, running)


def histogram_mean(totals: HistogramTotals | None, scale: float = 1.0) -> float | None:
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


