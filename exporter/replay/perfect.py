"""A perfect collector over the simulator: one window of its requests -> the observation a
policy decides on (the closed-loop bench's observer; `vllm-sizer replay` reads the emulated
exposition instead, exporter/replay/exposition.py).

What a collector would read from vLLM, taken exactly from the simulator instead of from metric
deltas: over the window (start, end],
- arrival rate = arrivals / window (all replicas), completion rate likewise;
- token means over the requests that completed in the window; TTFT over the first tokens
  emitted in it; ITL the token-weighted mean gap of the tokens emitted in it after their
  request's first (vLLM's `inter_token_latency` sum over count, what the collector reads and
  `slo.itl_ms` is defined on); the per-request time per output token the mean of the completed
  requests' own ITLs. The two differ under changing load: a completed request's ITL averages
  its whole lifetime (30 s and more for long outputs), the window's gaps only the window;
- pods: ready (serving) at the window's end; observed = ready at both ends (a collector has two
  samples of them); new and gone pods are flagged;
- running and waiting per pod: means over gauge samples taken through the window (ready pods);
  the backlog test per observed pod is the collector's own (`backlog_growing`);
- token-length histograms (vLLM's 1-2-5 buckets, exact sum) of the completed requests, from
  which the daemon measures the length CVs as it does from a real exposition, and the latency
  histograms in vLLM's buckets (TTFT of the first tokens, the window's token gaps, the completed
  requests' time per output token), from which it reads observed attainment;
- KV usage: KV tokens held over the capacity, at the window's end (vLLM's gauge), mean and max
  over ready pods; waiting requests at the end, summed (what the throughput analyzer reads).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from exporter.collector.observations import (
    STATUS_MESSAGES,
    DeploymentObservation,
    ObservationStatus,
)
from exporter.collector.pod_observation import MS_PER_S, Problem
from exporter.collector.saturation import backlog_growing
from exporter.collector.vllm_metrics import HistogramName
from exporter.testbed.emulator import DEFAULT_MAX_MODEL_LEN
from exporter.testbed.emulator_metrics import (
    ITL_BUCKETS_S,
    TTFT_BUCKETS_S,
    latency_histogram,
    length_histogram,
)
from model.baselines.throughput_analyzer import FleetState
from model.simulation.records import WindowRecords
from model.simulation.replica import IterationRecord, ReplicaState
from model.simulation.simulator import ReplicaStatus, SimResult

KV_CAPACITY_TOKENS = 449_200  # Llama-3.1-8B on one H100 (paper §IX), as the emulator uses


def prompt_tokens_per_period(
    arrival_s: np.ndarray, input_tokens: np.ndarray, start_s: float, end_s: float, periods: int
) -> tuple[np.ndarray, float] | None:
    """The prompt tokens of the requests that arrived in each of `periods` equal periods of
    [start_s, end_s), and the period (s): what the sidecar's per-second sampler reads from a
    pod, counted as they arrive (vLLM's counter counts them as they are prefilled: a burst a
    pod cannot prefill at once reads spread over the seconds it took)."""
    if periods < 1 or end_s <= start_s:
        return None
    period_s = (end_s - start_s) / periods
    inside = (arrival_s >= start_s) & (arrival_s < end_s)
    index = np.minimum(((arrival_s[inside] - start_s) / period_s).astype(np.int64), periods - 1)
    weights = input_tokens[inside].astype(np.float64)
    return np.bincount(index, weights=weights, minlength=periods), period_s


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowView:
    """One window as every arm sees it: our observation, the analyzer's gauges (end of the
    window), and what the bench judges (peak waiting over the samples, a replica starting)."""

    observation: DeploymentObservation
    kv_usage_ratio: float  # mean over ready pods at the end, 0-1
    max_kv_usage_ratio: float
    waiting_requests: int  # summed over ready pods at the end
    generated_tokens_rps: float
    peak_waiting: int  # the most requests waiting fleet-wide in any sample
    replica_starting: bool  # some replica was still loading during the window
    # The prompt tokens the pods took in each sample period and the period (s): the sidecar
    # sampler's per-second reading (exporter.sizing.bursts). None: not read.
    prompt_tokens: tuple[np.ndarray, float] | None = None

    def fleet_state(self, current_replicas: int, kv_capacity_tokens: float) -> FleetState:
        """The throughput analyzer's input; current_replicas is the count last asked for."""
        obs = self.observation
        return FleetState(
            kv_utilization=self.kv_usage_ratio,
            itl_ms=0.0 if obs.itl_ms is None else obs.itl_ms,
            waiting_requests=float(self.waiting_requests),
            generated_tokens_rps=self.generated_tokens_rps,
            ready_replicas=obs.ready_pods,
            current_replicas=current_replicas,
            kv_capacity_tokens=kv_capacity_tokens,
        )


def _ready(statuses: Sequence[ReplicaStatus]) -> dict[int, ReplicaStatus]:
    return {s.index: s for s in statuses if s.state is ReplicaState.READY}


def _mean_or_none(values: np.ndarray) -> float | None:
    values = values[~np.isnan(values)]
    return float(values.mean()) if values.size else None


def window_gaps(records: Sequence[IterationRecord]) -> tuple[np.ndarray, np.ndarray]:
    """The inter-token gaps (ms) of a window's iteration records and how many tokens had each."""
    cols = WindowRecords.of(records)
    return cols.gap_s * MS_PER_S, cols.gap_weight.astype(np.float64)


def token_gap_ms(gap_ms: np.ndarray, gap_weight: np.ndarray) -> float | None:
    """Token-weighted mean of inter-token gaps (ms), each gap with its token count; None
    without a token."""
    total = float(gap_weight.sum())
    return float((gap_ms * gap_weight).sum()) / total if total > 0 else None


def observe_window(
    result: SimResult,
    start_s: float,
    end_s: float,
    start_status: Sequence[ReplicaStatus],
    samples: Sequence[Sequence[ReplicaStatus]],
    *,
    records: Sequence[IterationRecord],
    kv_capacity_tokens: float = KV_CAPACITY_TOKENS,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    deployment: str = "sim",
) -> WindowView:
    """The window (start_s, end_s] of `result`; start_status is the fleet at start_s, samples
    the fleet at times through the window, the last one at end_s; `records` are the iterations
    that ended in the window (their tokens and gaps)."""
    if not end_s > start_s:
        raise ValueError(f"`end_s` must be > start_s ({start_s}), got {end_s}")
    if not samples:
        raise ValueError("`samples` must hold at least the fleet at end_s, got none")
    span_s = end_s - start_s
    before, after = _ready(start_status), _ready(samples[-1])
    observed = sorted(before.keys() & after.keys())
    arrived = result.arrived_between(start_s, end_s)
    done = result.finished_between(start_s, end_s)
    with np.errstate(invalid="ignore"):
        firsts = (result.first_token_s > start_s) & (result.first_token_s <= end_s)
    completed = int(np.count_nonzero(done))

    growing, backlog_total = False, 0.0
    for pod in observed:
        backlog = float(
            after[pod].running + after[pod].waiting - before[pod].running - before[pod].waiting
        )
        backlog_total += backlog
        pod_arrivals = np.count_nonzero(arrived & (result.replica == pod))
        if backlog_growing(backlog, float(pod_arrivals)):
            growing = True

    gauges = [(s.running, s.waiting) for sample in samples for s in _ready(sample).values()]
    running = float(np.mean([g[0] for g in gauges])) if gauges else None
    waiting = float(np.mean([g[1] for g in gauges])) if gauges else None
    kv = [s.kv_tokens / kv_capacity_tokens for s in after.values()]

    problems: set[Problem] = set()
    new_pods = tuple(str(p) for p in sorted(after.keys() - before.keys()))
    gone_pods = tuple(str(p) for p in sorted(before.keys() - after.keys()))
    if new_pods:
        problems.add(Problem.NEW_POD)
    if gone_pods:
        problems.add(Problem.GONE_POD)
    if completed == 0:
        problems.add(Problem.NO_COMPLETIONS)
    if not after:
        status = ObservationStatus.NO_PODS
    elif not observed:
        status = ObservationStatus.WARMING_UP
    elif completed == 0:
        status = ObservationStatus.NO_LATENCY
    else:
        status = ObservationStatus.OK
    gaps_ms, gap_weights = window_gaps(records)
    itl = token_gap_ms(gaps_ms, gap_weights)
    observation = DeploymentObservation(
        success=status in (ObservationStatus.OK, ObservationStatus.NO_LATENCY),
        status=status,
        message=STATUS_MESSAGES[status],
        deployment=deployment,
        window_s=span_s,
        end_time_s=end_s,
        ready_pods=len(after),
        observed_pods=len(observed),
        arrival_rate_rps=float(np.count_nonzero(arrived)) / span_s,
        completion_rate_rps=completed / span_s,
        backlog_change=backlog_total,
        avg_input_tokens=_mean_or_none(result.input_tokens[done].astype(np.float64)),
        avg_output_tokens=_mean_or_none(result.output_tokens[done].astype(np.float64)),
        ttft_ms=_mean_or_none(result.ttft_ms[firsts]),
        itl_ms=itl,
        request_tpot_ms=_mean_or_none(result.itl_ms[done]),
        avg_running_per_pod=running,
        avg_waiting_per_pod=waiting,
        kv_cache_usage_ratio=float(np.mean(kv)) if kv else None,
        max_kv_cache_usage_ratio=max(kv) if kv else None,
        queue_growing=growing,
        pods=(),
        new_pods=new_pods,
        gone_pods=gone_pods,
        failures=(),
        problems=tuple(sorted(problems)),
        windows={
            HistogramName.PROMPT_LEN: length_histogram(result.input_tokens[done], max_model_len),
            HistogramName.GENERATION_LEN: length_histogram(
                result.output_tokens[done], max_model_len
            ),
            # vLLM's latency histograms, as the SLO window and the headroom read them.
            HistogramName.TTFT_S: latency_histogram(
                result.ttft_ms[firsts] / MS_PER_S, TTFT_BUCKETS_S
            ),
            HistogramName.ITL_S: latency_histogram(gaps_ms / MS_PER_S, ITL_BUCKETS_S, gap_weights),
            HistogramName.REQUEST_TPOT_S: latency_histogram(
                result.itl_ms[done] / MS_PER_S, ITL_BUCKETS_S
            ),
        },
    )
    starting = any(
        s.state is ReplicaState.STARTING for sample in (start_status, *samples) for s in sample
    )
    return WindowView(
        prompt_tokens=prompt_tokens_per_period(
            result.arrival_s, result.input_tokens, start_s, end_s, len(samples)
        ),
        observation=observation,
        kv_usage_ratio=float(np.mean(kv)) if kv else 0.0,
        max_kv_usage_ratio=max(kv) if kv else 0.0,
        waiting_requests=sum(s.waiting for s in after.values()),
        generated_tokens_rps=int(WindowRecords.of(records).emitted_tokens.sum()) / span_s,
        peak_waiting=max(sum(s.waiting for s in sample) for sample in samples),
        replica_starting=starting,
    )
