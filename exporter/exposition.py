"""Prometheus view of the last cycle: a custom collector over an immutable snapshot.

It never computes and never does I/O: `publish()` swaps the snapshot, `collect()` turns it into
fresh metric families. A value that is None is omitted, never exported as 0, so KEDA's fallback
applies instead of a scale-to-minimum. Units are converted here: ms -> s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric

from exporter.recommender import Decision
from model import ServiceParams

PREFIX = "vllm_sizer_"
LABELS = ("deployment", "model_name")
S_PER_MS = 1e-3


@dataclass(frozen=True, slots=True, kw_only=True)
class DeploymentStatus:
    """Everything exported for one deployment after one cycle; ms and req/s."""

    deployment: str
    model_name: str
    decision: Decision
    params: ServiceParams | None
    tuner_state: str
    tuner_reason: str
    fit_ttft_error: float | None
    fit_itl_error: float | None
    observed_ttft_ms: float | None
    observed_itl_ms: float | None
    slo_ttft_ms: float | None
    slo_itl_ms: float | None


@dataclass(frozen=True, slots=True)
class CycleSnapshot:
    """The results of one cycle, one entry per configured deployment."""

    deployments: tuple[DeploymentStatus, ...] = ()


EMPTY_SNAPSHOT = CycleSnapshot()


def _ms(value: float | None) -> float | None:
    return None if value is None else value * S_PER_MS


def _param(name: str) -> Callable[[DeploymentStatus], float | None]:
    return lambda s: None if s.params is None else getattr(s.params, name) * S_PER_MS


@dataclass(frozen=True, slots=True)
class GaugeSpec:
    """One exported gauge: its name (without prefix), help text and value per deployment."""

    name: str
    help: str
    value: Callable[[DeploymentStatus], float | None]


GAUGES: tuple[GaugeSpec, ...] = (
    GaugeSpec(
        "desired_replicas",
        "Replicas that meet the SLO targets, as of the last cycle.",
        lambda s: s.decision.desired_replicas,
    ),
    GaugeSpec(
        "current_replicas",
        "Ready vLLM pods seen, as of the last cycle.",
        lambda s: s.decision.current_replicas,
    ),
    GaugeSpec(
        "predicted_ttft_seconds",
        "Model TTFT at the current load on the current replicas, as of the last cycle.",
        lambda s: _ms(s.decision.predicted_ttft_ms),
    ),
    GaugeSpec(
        "predicted_itl_seconds",
        "Model ITL at the current load on the current replicas, as of the last cycle.",
        lambda s: _ms(s.decision.predicted_itl_ms),
    ),
    GaugeSpec(
        "observed_ttft_seconds",
        "Mean TTFT measured over the last cycle's window.",
        lambda s: _ms(s.observed_ttft_ms),
    ),
    GaugeSpec(
        "observed_itl_seconds",
        "Mean ITL measured over the last cycle's window.",
        lambda s: _ms(s.observed_itl_ms),
    ),
    GaugeSpec(
        "arrival_rate_requests_per_second",
        "Estimated arrival rate of the deployment, as of the last cycle.",
        lambda s: s.decision.arrival_rate_rps,
    ),
    GaugeSpec(
        "max_rate_per_replica_requests_per_second",
        "Largest per-replica rate meeting the SLO targets, as of the last cycle.",
        lambda s: s.decision.max_rate_per_replica_rps,
    ),
    GaugeSpec(
        "saturation_rate_per_replica_requests_per_second",
        "Per-replica rate at which the queue grows without bound, as of the last cycle.",
        lambda s: s.decision.saturation_rate_per_replica_rps,
    ),
    GaugeSpec(
        "model_alpha_seconds",
        "Fitted per-iteration overhead, as of the last cycle.",
        _param("alpha_ms"),
    ),
    GaugeSpec(
        "model_beta_seconds",
        "Fitted compute time per token, as of the last cycle.",
        _param("beta_ms"),
    ),
    GaugeSpec(
        "model_gamma_seconds",
        "Fitted KV-cache read time per cached token, as of the last cycle.",
        _param("gamma_ms"),
    ),
    GaugeSpec("slo_ttft_seconds", "Configured TTFT target.", lambda s: _ms(s.slo_ttft_ms)),
    GaugeSpec("slo_itl_seconds", "Configured ITL target.", lambda s: _ms(s.slo_itl_ms)),
)


class SnapshotCollector:
    """Serves the last cycle's results; never computes, never does I/O."""

    def __init__(self) -> None:
        self._snapshot = EMPTY_SNAPSHOT

    def publish(self, snapshot: CycleSnapshot) -> None:
        """Swap in a new snapshot (one reference assignment; snapshots are immutable)."""
        self._snapshot = snapshot

    @property
    def snapshot(self) -> CycleSnapshot:
        return self._snapshot

    def describe(self) -> Iterator[Metric]:
        return self._families(EMPTY_SNAPSHOT)  # names only: duplicates caught at register()

    def collect(self) -> Iterator[Metric]:
        return self._families(self._snapshot)

    def _families(self, snapshot: CycleSnapshot) -> Iterator[Metric]:
        for spec in GAUGES:
            family = GaugeMetricFamily(PREFIX + spec.name, spec.help, labels=LABELS)
            for status in snapshot.deployments:
                value = spec.value(status)
                if value is not None:
                    family.add_metric([status.deployment, status.model_name], float(value))
            yield family
        errors = GaugeMetricFamily(
            PREFIX + "fit_relative_error",
            "Mean relative error of the last fit (label metric), as of the last cycle.",
            labels=(*LABELS, "metric"),
        )
        recommendation = GaugeMetricFamily(
            PREFIX + "recommendation_info",
            "Why desired_replicas has its value (label reason), as of the last cycle.",
            labels=(*LABELS, "reason"),
        )
        tuner = GaugeMetricFamily(
            PREFIX + "tuner_state_info",
            "Tuner state (warming, fitted, holding) and its reason, as of the last cycle.",
            labels=(*LABELS, "state", "reason"),
        )
        for s in snapshot.deployments:
            key = [s.deployment, s.model_name]
            for metric, value in (("ttft", s.fit_ttft_error), ("itl", s.fit_itl_error)):
                if value is not None:
                    errors.add_metric([*key, metric], value)
            recommendation.add_metric([*key, s.decision.reason.value], 1.0)
            tuner.add_metric([*key, s.tuner_state, s.tuner_reason], 1.0)
        yield errors
        yield recommendation
        yield tuner


def build_info_family(version: str) -> InfoMetricFamily:
    """vllm_sizer_build_info{version=...} 1."""
    return InfoMetricFamily(PREFIX + "build", "Build information.", value={"version": version})
