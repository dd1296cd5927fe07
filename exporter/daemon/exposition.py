"""Prometheus view of the last cycle: a custom collector over an immutable snapshot.

It never computes and never does I/O: `publish()` swaps the snapshot, `collect()` turns it into
fresh metric families. A value that is None is omitted, never exported as 0, so KEDA's fallback
applies instead of a scale-to-minimum. Units are converted here: ms -> s.

Changing state (the recommendation's reason, the tuner's state) is an enum-style gauge: one
series per known value, 1 for the current one and 0 for the others, so a state can be alerted
on with `== 1` and its series never churn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric

from exporter.config.values import DemandKind
from exporter.daemon.exposition_fleet import fleet_families
from exporter.daemon.exposition_slo import PERCENTILE_GAUGES as PERCENTILE_GAUGES
from exporter.daemon.exposition_slo import (
    attainment_families,
    feasibility_family,
    percentile_families,
)
from exporter.daemon.metric_names import LABELS as LABELS
from exporter.daemon.metric_names import PREFIX as PREFIX
from exporter.daemon.metric_names import S_PER_MS as S_PER_MS
from exporter.sizing.attainment import ObservedAttainment
from exporter.sizing.fleet_cycle import FleetStatus
from exporter.sizing.forecasters import ForecasterName
from exporter.sizing.headroom import Headroom, HeadroomReason
from exporter.sizing.reasons import Reason
from exporter.sizing.recommender import Decision
from exporter.sizing.slo_targets import BindingTarget
from exporter.sizing.traffic import LengthCvKind, TrafficShape
from model import PercentileTarget, ServiceParams, TunerReason, TunerState


@dataclass(frozen=True, slots=True, kw_only=True)
class DeploymentStatus:
    """Everything exported for one deployment after one cycle; ms and req/s."""

    deployment: str
    model_name: str
    decision: Decision
    params: ServiceParams | None
    tuner_state: TunerState
    tuner_reason: TunerReason
    fit_ttft_error: float | None
    fit_itl_error: float | None
    observed_ttft_ms: float | None
    observed_itl_ms: float | None
    slo_ttft_ms: float | None
    slo_itl_ms: float | None
    source_up: bool  # the last read gave at least one pod's sample
    pods_observed: int  # pods whose metrics were read in the last cycle
    saturated: bool | None  # None: neither a prediction nor an observation to judge by
    slo_headroom_ratio: float | None
    demand: float | None = None  # the scale_from_zero query's value (None: failed or none)
    demand_kind: DemandKind | None = None  # None without scale_from_zero
    traffic: TrafficShape = TrafficShape()  # smoothed measurements of the traffic
    kv_batch_limit: int | None = None  # the batch the KV cache holds; None: capacity unknown
    calibration_confidence: float = 0.0  # 0-1, model.calibration.trust
    extrapolation_ratio: float | None = None  # exporter.sizing.evidence; None: no points
    capacity_extrapolated: bool | None = None  # the ratio beyond 1.1; None: no points
    identified: tuple[bool, bool, bool] | None = None  # per parameter; None without params
    slo_percentiles: tuple[PercentileTarget, ...] = ()  # the configured percentile targets
    observed_attainment: tuple[ObservedAttainment, ...] = ()  # over slo_window_s
    slo_window_requests: float | None = None  # requests with a first token in slo_window_s
    headroom: Headroom | None = None  # the capacity factor from observed misses
    prompt_burst_factor: float | None = None  # exporter.sizing.bursts; None: no reading
    forecaster: ForecasterName | None = None  # the look-ahead's; None before a rate was read
    forecast_horizon_s: float | None = None
    forecast_error_ratio: float | None = None  # its recent backtest error; None: too few


class Signal(StrEnum):
    """Which latency a fit error is about; exported label values."""

    TTFT = "ttft"
    ITL = "itl"


class Parameter(StrEnum):
    """A model parameter; exported label values (in ServiceParams order)."""

    ALPHA = "alpha"
    BETA = "beta"
    GAMMA = "gamma"


class ParameterSource(StrEnum):
    """Where a published parameter's value comes from; exported label values."""

    DATA = "data"  # the window identified it
    PRIOR = "prior"  # held at the fit's prior (one request shape cannot pin it)


@dataclass(frozen=True, slots=True)
class CycleSnapshot:
    """The results of one cycle, one entry per configured deployment that has a decision."""

    deployments: tuple[DeploymentStatus, ...] = ()
    fleet: FleetStatus | None = None  # the fleet plan's, with a `models` section


EMPTY_SNAPSHOT = CycleSnapshot()


def _ms(value: float | None) -> float | None:
    return None if value is None else value * S_PER_MS


def _param(name: str) -> Callable[[DeploymentStatus], float | None]:
    return lambda s: None if s.params is None else getattr(s.params, name) * S_PER_MS


def _flag(value: bool | None) -> float | None:
    return None if value is None else float(value)


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
        "Model TTFT at the current load on the current replicas (+Inf when saturated; never "
        "scale on it), as of the last cycle.",
        lambda s: _ms(s.decision.predicted_ttft_ms),
    ),
    GaugeSpec(
        "predicted_itl_seconds",
        "Model ITL at the current load on the current replicas (+Inf when saturated; never "
        "scale on it), as of the last cycle.",
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
    GaugeSpec(
        "saturated",
        "1 when the load saturates the current replicas (model or growing backlog), else 0.",
        lambda s: _flag(s.saturated),
    ),
    GaugeSpec(
        "slo_headroom_ratio",
        "SLO capacity of the current replicas over the arrival rate (0 when saturated, at most "
        "100), as of the last cycle.",
        lambda s: s.slo_headroom_ratio,
    ),
    GaugeSpec(
        "prefix_cache_hit_ratio",
        "Share of prompt tokens served from vLLM's prefix cache, smoothed over the last 10 "
        "windows, as of the last cycle.",
        lambda s: s.traffic.cached_prompt_ratio,
    ),
    GaugeSpec(
        "arrival_cv",
        "Coefficient of variation of inter-arrival times, measured by the 1 s sampler (sidecar "
        "mode only) and smoothed over the last 10 windows, as of the last cycle.",
        lambda s: s.traffic.arrival_cv,
    ),
    GaugeSpec(
        "kv_batch_limit",
        "Largest batch the KV cache holds at the mean request, min(max_num_seqs, KV tokens / "
        "mean context): the batch size sizing uses, as of the last cycle.",
        lambda s: s.kv_batch_limit,
    ),
    GaugeSpec(
        "source_up",
        "1 when the last cycle read at least one pod's vLLM metrics, else 0.",
        lambda s: float(s.source_up),
    ),
    GaugeSpec(
        "pods_observed",
        "Pods whose vLLM metrics the last cycle read.",
        lambda s: s.pods_observed,
    ),
    GaugeSpec(
        "headroom_factor",
        "Capacity factor learnt from observed SLO misses the model did not predict (1: none): "
        "the rate is sized for x this, as of the last cycle.",
        lambda s: None if s.headroom is None else s.headroom.factor,
    ),
    GaugeSpec(
        "prompt_burst_factor",
        "Prompt tokens per 5 s at p95 over a Poisson stream's (1: within noise).",
        lambda s: s.prompt_burst_factor,
    ),
    GaugeSpec(
        "calibration_confidence",
        "How far the calibration can be trusted, 0-1 (0 while warming; >= 0.5: size on "
        "desired_replicas), as of the last cycle.",
        lambda s: s.calibration_confidence,
    ),
    GaugeSpec(
        "forecast_horizon_seconds",
        "How far ahead the look-ahead forecasts the arrival rate: the pods' own startup "
        "delay once measured, else look_ahead_s (0: none), as of the last cycle.",
        lambda s: s.forecast_horizon_s,
    ),
    GaugeSpec(
        "forecast_error_ratio",
        "Mean absolute error of the forecaster's rate one horizon ahead over its last hour of "
        "scored cycles, over the mean arrival rate (absent before 20 are scored), as of the "
        "last cycle.",
        lambda s: s.forecast_error_ratio,
    ),
    GaugeSpec(
        "extrapolation_ratio",
        "How far the model's capacity per replica lies outside the observed rates (1 within "
        "them).",
        lambda s: s.extrapolation_ratio,
    ),
    GaugeSpec(
        "capacity_extrapolated",
        "1 when extrapolation_ratio exceeds 1.1: max_rate_per_replica is a bound or an "
        "extrapolation.",
        lambda s: _flag(s.capacity_extrapolated),
    ),
)


@dataclass(frozen=True, slots=True)
class EnumGaugeSpec:
    """An enum-style gauge: one series per value of `values`, 1 for the current, 0 others."""

    name: str
    help: str
    label: str
    values: type[StrEnum]
    current: Callable[[DeploymentStatus], StrEnum | None]  # None: no series at all


ENUM_GAUGES: tuple[EnumGaugeSpec, ...] = (
    EnumGaugeSpec(
        "recommendation_reason",
        "Why desired_replicas has its value: 1 for the current reason, 0 for the others.",
        "reason",
        Reason,
        lambda s: s.decision.reason,
    ),
    EnumGaugeSpec(
        "tuner_state",
        "The tuner's state: 1 for the current state, 0 for the others.",
        "state",
        TunerState,
        lambda s: s.tuner_state,
    ),
    EnumGaugeSpec(
        "tuner_reason",
        "Why the tuner is in its state: 1 for the current reason, 0 for the others.",
        "reason",
        TunerReason,
        lambda s: s.tuner_reason,
    ),
    EnumGaugeSpec(
        "binding_target",
        "Which target sets the SLO capacity of a replica (for infeasible targets: the one "
        "missed): 1 for the current one, 0 for the others; absent before the first sizing.",
        "target",
        BindingTarget,
        lambda s: s.decision.binding_target,
    ),
    EnumGaugeSpec(
        "headroom_reason",
        "Why headroom_factor has its value: 1 for the current reason, 0 for the others.",
        "reason",
        HeadroomReason,
        lambda s: None if s.headroom is None else s.headroom.reason,
    ),
    EnumGaugeSpec(
        "forecaster",
        "The forecaster the look-ahead sized with (the `forecaster` key; auto: the one its "
        "backtest picks): 1 for the current one, 0 for the others.",
        "forecaster",
        ForecasterName,
        lambda s: s.forecaster,
    ),
)


@dataclass(frozen=True, slots=True)
class LabelledGaugeSpec:
    """A gauge with one more label: (label value, value) pairs per deployment; a None value
    is omitted."""

    name: str
    help: str
    label: str
    values: Callable[[DeploymentStatus], Iterable[tuple[str, float | None]]]


LABELLED_GAUGES: tuple[LabelledGaugeSpec, ...] = (
    LabelledGaugeSpec(
        "fit_error_ratio",
        "Mean relative error of the last fit over its window (0-1), as of the last cycle.",
        "signal",
        lambda s: ((Signal.TTFT.value, s.fit_ttft_error), (Signal.ITL.value, s.fit_itl_error)),
    ),
    LabelledGaugeSpec(
        "demand",
        "Upstream demand read by the scale_from_zero query, as of the last cycle: requests/s "
        "(kind rate) or requests (kind queue).",
        "kind",
        lambda s: () if s.demand_kind is None else ((s.demand_kind.value, s.demand),),
    ),
    LabelledGaugeSpec(
        "request_length_cv",
        "CV of request lengths from vLLM's token histograms, last 10 windows (output: at "
        "least the KV cache's).",
        "kind",
        lambda s: ((kind.value, s.traffic.length_cv(kind)) for kind in LengthCvKind),
    ),
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
        for enum_spec in ENUM_GAUGES:
            family = GaugeMetricFamily(
                PREFIX + enum_spec.name, enum_spec.help, labels=(*LABELS, enum_spec.label)
            )
            for status in snapshot.deployments:
                current = enum_spec.current(status)
                if current is None:
                    continue
                for member in enum_spec.values:
                    key = [status.deployment, status.model_name, member.value]
                    family.add_metric(key, float(member is current))
            yield family
        for labelled in LABELLED_GAUGES:
            family = GaugeMetricFamily(
                PREFIX + labelled.name, labelled.help, labels=(*LABELS, labelled.label)
            )
            for status in snapshot.deployments:
                key = [status.deployment, status.model_name]
                for label_value, value in labelled.values(status):
                    if value is not None:
                        family.add_metric([*key, label_value], value)
            yield family
        yield _parameter_sources(snapshot)
        yield from percentile_families(snapshot.deployments)
        yield from attainment_families(snapshot.deployments)
        yield feasibility_family(snapshot.deployments)
        yield from fleet_families(snapshot.fleet)


def _parameter_sources(snapshot: CycleSnapshot) -> GaugeMetricFamily:
    """Enum-style per parameter: 1 for its current source, 0 for the other; no series while
    the tuner has no parameters."""
    family = GaugeMetricFamily(
        PREFIX + "parameter_source",
        "Where each published model parameter comes from: 1 for the current source (data: "
        "identified by the window; prior: held at the fit's prior), 0 for the other.",
        labels=(*LABELS, "parameter", "source"),
    )
    for s in snapshot.deployments:
        if s.identified is None:
            continue
        for parameter, known in zip(Parameter, s.identified, strict=True):
            current = ParameterSource.DATA if known else ParameterSource.PRIOR
            for source in ParameterSource:
                key = [s.deployment, s.model_name, parameter.value, source.value]
                family.add_metric(key, float(source is current))
    return family


class BuildInfoCollector:
    """vllm_sizer_build_info{version} 1, as a collector so the registry stays explicit."""

    def __init__(self, version: str) -> None:
        self._version = version

    def collect(self) -> Iterator[Metric]:
        yield build_info_family(self._version)


def build_info_family(version: str) -> InfoMetricFamily:
    """vllm_sizer_build_info{version=...} 1."""
    return InfoMetricFamily(PREFIX + "build", "Build information.", value={"version": version})
