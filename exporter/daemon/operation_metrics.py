"""The daemon's own counters, histogram and gauges: failed reads, degraded windows, cycles.

Every documented label value is created at 0 when the daemon starts (per deployment for the
error counters), so `increase()` and `rate()` see the first error instead of a series that
appears with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from exporter.base.errors import FailureReason
from exporter.collector.observations import DeploymentObservation, ObservationStatus
from exporter.collector.pod_observation import Problem
from exporter.config.values import DeploymentConfig, SourceKind
from exporter.daemon.exposition import PREFIX

# From a few ms (one emulated deployment) to a minute (a thousand deployments with refits).
CYCLE_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class CycleOutcome(StrEnum):
    """How a cycle ended; exported label values."""

    OK = "ok"  # at least one deployment was observed
    # None observed, but pods were read that have no earlier sample to close a window with:
    # the first cycle after a start, or the first read after every read had failed.
    WARMING_UP = "warming_up"
    FAILED = "failed"  # no deployment was observed, and none is warming up


class SkippedEvent(StrEnum):
    """Why the scheduler did not start a cycle on time; exported label values."""

    MISSED = "missed"  # a start time passed while the previous cycle still ran (never bunched)


class OperationMetrics:
    """Registers the daemon's own metrics on `registry`, label values created at 0."""

    def __init__(
        self, registry: CollectorRegistry, deployments: Sequence[DeploymentConfig]
    ) -> None:
        self.scrape_errors = Counter(
            PREFIX + "scrape_errors",
            "Failed reads of vLLM metrics (source scrape or prometheus) and of the scale_from_zero "
            "demand query (source demand), by reason.",
            ["deployment", "source", "reason"],
            registry=registry,
        )
        self.observation_problems = Counter(
            PREFIX + "observation_problems",
            "Degraded observation windows (counter resets, new or gone pods, ...), by problem.",
            ["deployment", "problem"],
            registry=registry,
        )
        self.cycle_duration = Gauge(
            PREFIX + "cycle_duration_seconds", "Wall time of the last cycle.", registry=registry
        )
        self.cycle_seconds = Histogram(
            PREFIX + "cycle_seconds",
            "Wall time of each cycle.",
            buckets=CYCLE_BUCKETS_S,
            registry=registry,
        )
        self.last_success = Gauge(
            PREFIX + "last_successful_cycle_timestamp_seconds",
            "Unix time of the last cycle in which at least one deployment was observed.",
            registry=registry,
        )
        self.cycles = Counter(
            PREFIX + "cycles", "Cycles run, by outcome.", ["outcome"], registry=registry
        )
        self.cycles_skipped = Counter(
            PREFIX + "cycles_skipped",
            "Cycles skipped or run late because the previous one was still running.",
            ["event"],
            registry=registry,
        )
        self.state_save_errors = Counter(
            PREFIX + "state_save_errors",
            "Failed writes of the state file (also counted once at start if it is not writable).",
            registry=registry,
        )
        for dep in deployments:
            for reason in FailureReason:
                self.scrape_errors.labels(dep.name, dep.source.kind, reason)
                if dep.scale_from_zero is not None:
                    self.scrape_errors.labels(dep.name, SourceKind.DEMAND, reason)
            for problem in Problem:
                self.observation_problems.labels(dep.name, problem)
        for outcome in CycleOutcome:
            self.cycles.labels(outcome)
        for event in SkippedEvent:
            self.cycles_skipped.labels(event)

    def observe_cycle(self, duration_s: float, outcome: CycleOutcome) -> None:
        """One finished cycle: its wall time (s) and outcome."""
        self.cycle_duration.set(duration_s)
        self.cycle_seconds.observe(duration_s)
        self.cycles.labels(outcome).inc()


# From a ms (a loopback Prometheus) to the 10 s default query timeout and beyond.
QUERY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class QueryMetrics:
    """The load the sizer puts on Prometheus: its queries and their wall time. In central mode a
    cycle reads up to 100 deployments with one series query and one scrape-time query, plus one
    demand query per deployment with scale_from_zero."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.seconds = Histogram(
            PREFIX + "prometheus_query_seconds",
            "Wall time of each query to Prometheus (answered or failed); its _count is the number "
            "of queries.",
            buckets=QUERY_BUCKETS_S,
            registry=registry,
        )

    def observe(self, seconds: float) -> None:
        self.seconds.observe(seconds)


def cycle_outcome(
    observed_any: bool, observations: Sequence[DeploymentObservation | None]
) -> CycleOutcome:
    """OK when any deployment was observed (at zero: its demand read); WARMING_UP when none was
    but one only waits for a second read of its pods (a first cycle is not a failure); FAILED
    otherwise."""
    if observed_any:
        return CycleOutcome.OK
    if any(obs is not None and obs.status is ObservationStatus.WARMING_UP for obs in observations):
        return CycleOutcome.WARMING_UP
    return CycleOutcome.FAILED
