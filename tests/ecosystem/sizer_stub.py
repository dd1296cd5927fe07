"""A stand-in for the daemon's /metrics: every exported series, values set by the test.

Used to run the shipped PromQL (KEDA trigger, adapter rule, dashboard) against a real Prometheus
server without depending on the daemon's tuning: several stubs play the sidecar copies of one
deployment, one of them frozen (its last successful cycle long ago). The enum-style gauges use
the daemon's own value sets (1 for the current value, 0 for the others), the error counters
exist at 0 for every label value, and the cycle counters and histogram grow with wall time as
if one cycle ran every `cycle_period_s`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from exporter.base.errors import FailureReason
from exporter.collector.pod_observation import Problem
from exporter.config.values import DemandKind, SourceKind
from exporter.daemon.exposition import ENUM_GAUGES, Parameter, ParameterSource, Signal
from exporter.daemon.operation_metrics import (
    CYCLE_BUCKETS_S,
    QUERY_BUCKETS_S,
    CycleOutcome,
    SkippedEvent,
)
from exporter.sizing.fleet.values import PlanReason
from exporter.sizing.traffic import LengthCvKind

PREFIX = "vllm_sizer_"
FROZEN_AFTER_S = 60.0  # a stub whose last success is older fails its cycles


@dataclass(kw_only=True)
class SizerValues:
    """What one stub exports; mutable so a test can change it between scrapes."""

    deployment: str = "llama-8b-vllm"
    model_name: str = "meta-llama/Llama-3.1-8B-Instruct"
    desired_replicas: int = 5
    current_replicas: int = 3
    last_success_age_s: float = 1.0
    cycle_period_s: float = 0.25
    cycle_duration_s: float = 0.012
    per_deployment: dict[str, float] = field(
        default_factory=lambda: {
            "predicted_ttft_seconds": 0.21,
            "predicted_itl_seconds": 0.031,
            "observed_ttft_seconds": 0.24,
            "observed_itl_seconds": 0.029,
            "arrival_rate_requests_per_second": 11.0,
            "max_rate_per_replica_requests_per_second": 2.4,
            "saturation_rate_per_replica_requests_per_second": 3.9,
            "model_alpha_seconds": 0.006,
            "model_beta_seconds": 0.00003,
            "model_gamma_seconds": 0.0000002,
            "slo_ttft_seconds": 0.5,
            "slo_itl_seconds": 0.05,
            "saturated": 0.0,
            "slo_headroom_ratio": 0.65,  # 2.4 x 3 / 11: the SLOs need more replicas
            "source_up": 1.0,
            "pods_observed": 3.0,
            "observed_slo_window_requests": 1500.0,
            "prefix_cache_hit_ratio": 0.42,
            "arrival_cv": 1.3,
            "kv_batch_limit": 180.0,
            "calibration_confidence": 0.9,
            "headroom_factor": 1.25,
            "extrapolation_ratio": 1.4,
            "capacity_extrapolated": 1.0,
            "prompt_burst_factor": 2.1,
            "forecast_horizon_seconds": 300.0,
            "forecast_error_ratio": 0.08,
        }
    )
    # The current value of each enum-style gauge (exporter.daemon.exposition.ENUM_GAUGES).
    enums: dict[str, str] = field(
        default_factory=lambda: {
            "recommendation_reason": "scale_up",
            "tuner_state": "fitted",
            "tuner_reason": "accepted",
            "binding_target": "ttft_percentile",
            "headroom_reason": "holding",
            "forecaster": "holt_winters",
        }
    )
    # Percentile gauges and predicted attainment: their labels and value.
    percentiles: dict[str, tuple[dict[str, str], float]] = field(
        default_factory=lambda: {
            "predicted_ttft_quantile_seconds": ({"percentile": "95"}, 0.42),
            "predicted_itl_quantile_seconds": ({"percentile": "99", "kind": "per_token"}, 0.061),
            "slo_ttft_quantile_seconds": ({"percentile": "95"}, 0.5),
            "slo_itl_quantile_seconds": ({"percentile": "99", "kind": "per_token"}, 0.08),
            "predicted_slo_attainment_ratio": ({"target": "ttft_p95"}, 0.97),
            "observed_slo_attainment_ratio": ({"target": "ttft_p95", "bound": "exact"}, 0.96),
            # 0: the target the model misses at replicas.max (the dashboard draws the 0s).
            "slo_target_feasible": ({"target": "itl_per_token_p99"}, 0.0),
        }
    )
    # The scale_from_zero demand, by kind (a deployment with scale_from_zero has one).
    demand: dict[str, float] = field(default_factory=lambda: {DemandKind.RATE.value: 11.0})
    fit_error: dict[str, float] = field(
        default_factory=lambda: {Signal.TTFT.value: 0.04, Signal.ITL.value: 0.02}
    )
    length_cv: dict[str, float] = field(
        default_factory=lambda: {LengthCvKind.PROMPT.value: 0.9, LengthCvKind.OUTPUT.value: 1.1}
    )
    parameter_sources: dict[str, str] = field(
        default_factory=lambda: {"alpha": "data", "beta": "data", "gamma": "prior"}
    )
    # Scrape errors per cycle, by reason (the others stay at 0).
    errors_per_cycle: dict[str, float] = field(
        default_factory=lambda: {FailureReason.TIMEOUT.value: 0.1}
    )


class StubCollector:
    """Builds the families from the current `SizerValues` on every scrape."""

    def __init__(self, values: SizerValues) -> None:
        self.values = values
        self.started = time.monotonic()

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        v = self.values
        labels = ["deployment", "model_name"]
        key = [v.deployment, v.model_name]

        def gauge(name: str, value: float) -> Metric:
            family = GaugeMetricFamily(PREFIX + name, f"{name} as of the last cycle", labels=labels)
            family.add_metric(key, value)
            return family

        yield gauge("desired_replicas", v.desired_replicas)
        yield gauge("current_replicas", v.current_replicas)
        for name, value in v.per_deployment.items():
            yield gauge(name, value)
        for spec in ENUM_GAUGES:
            current = spec.values(v.enums[spec.name])  # ValueError on an unknown value
            enum = GaugeMetricFamily(PREFIX + spec.name, spec.help, labels=[*labels, spec.label])
            for member in spec.values:
                enum.add_metric([*key, member.value], float(member is current))
            yield enum
        for name, (extra, value) in v.percentiles.items():
            family = GaugeMetricFamily(PREFIX + name, name, labels=[*labels, *extra])
            family.add_metric([*key, *extra.values()], value)
            yield family
        fit = GaugeMetricFamily(PREFIX + "fit_error_ratio", "fit error", labels=[*labels, "signal"])
        for signal, error in v.fit_error.items():
            fit.add_metric([*key, signal], error)
        yield fit
        demand = GaugeMetricFamily(PREFIX + "demand", "demand", labels=[*labels, "kind"])
        for kind, value in v.demand.items():
            demand.add_metric([*key, DemandKind(kind).value], value)  # ValueError if unknown
        yield demand
        spread = GaugeMetricFamily(
            PREFIX + "request_length_cv", "length CV", labels=[*labels, "kind"]
        )
        for kind, cv in v.length_cv.items():
            spread.add_metric([*key, kind], cv)
        yield spread
        sources = GaugeMetricFamily(
            PREFIX + "parameter_source", "source", labels=[*labels, "parameter", "source"]
        )
        for parameter in Parameter:
            current = v.parameter_sources[parameter.value]
            for source in ParameterSource:
                sources.add_metric(
                    [*key, parameter.value, source.value], float(source.value == current)
                )
        yield sources
        yield from self._fleet(v)
        yield from self._operation(v)

    def _fleet(self, v: SizerValues) -> Iterator[Metric]:
        """A fleet plan's series: this deployment a variant of its model on one L40S type."""
        model, kind = [v.model_name], ["L40S"]
        reason = GaugeMetricFamily(PREFIX + "fleet_plan_reason", "plan reason",
                                   labels=["model_name", "reason"])
        for member in PlanReason:
            reason.add_metric([*model, member.value], float(member is PlanReason.LEAST_COST))
        yield reason
        for name, value in (("fleet_demand_requests_per_second", 11.0),
                            ("fleet_cost_per_hour", 5.0),
                            ("fleet_unserved_requests_per_second", 0.0)):
            family = GaugeMetricFamily(PREFIX + name, name, labels=["model_name"])
            family.add_metric(model, value)
            yield family
        for name, gpus in (("fleet_gpus_available", 8.0), ("fleet_gpus_planned", 5.0)):
            family = GaugeMetricFamily(PREFIX + name, name, labels=["accelerator"])
            family.add_metric(kind, gpus)
            yield family
        for name, value in (("variant_trusted", 1.0),
                            ("variant_capacity_requests_per_second", 2.4),
                            ("variant_transfer_capacity_error_ratio", 0.12)):
            family = GaugeMetricFamily(PREFIX + name, name, labels=["deployment", "model_name"])
            family.add_metric([v.deployment, v.model_name], value)
            yield family
        errors = CounterMetricFamily(PREFIX + "inventory_read_errors", "inventory errors",
                                     labels=["accelerator", "reason"])
        for failure in FailureReason:
            errors.add_metric([*kind, failure.value], 0)
        yield errors

    def _operation(self, v: SizerValues) -> Iterator[Metric]:
        """The daemon's own metrics, grown as if a cycle ran every `cycle_period_s`."""
        n = int((time.monotonic() - self.started) / v.cycle_period_s)
        errors = CounterMetricFamily(
            PREFIX + "scrape_errors", "errors", labels=["deployment", "source", "reason"]
        )
        for reason in FailureReason:
            count = int(n * v.errors_per_cycle.get(reason.value, 0.0))
            errors.add_metric([v.deployment, SourceKind.SCRAPE.value, reason.value], count)
        yield errors
        problems = CounterMetricFamily(
            PREFIX + "observation_problems", "problems", labels=["deployment", "problem"]
        )
        for problem in Problem:
            problems.add_metric([v.deployment, problem.value], 0)
        yield problems
        ok = v.last_success_age_s < FROZEN_AFTER_S
        cycles = CounterMetricFamily(PREFIX + "cycles", "cycles", labels=["outcome"])
        for outcome in CycleOutcome:
            cycles.add_metric([outcome.value], n if ok == (outcome is CycleOutcome.OK) else 0)
        yield cycles
        skipped = CounterMetricFamily(PREFIX + "cycles_skipped", "skipped", labels=["event"])
        for event in SkippedEvent:
            skipped.add_metric([event.value], 0)
        yield skipped
        save_errors = CounterMetricFamily(PREFIX + "state_save_errors", "state file")
        save_errors.add_metric([], 0)
        yield save_errors
        duration = GaugeMetricFamily(PREFIX + "cycle_duration_seconds", "last cycle")
        duration.add_metric([], v.cycle_duration_s)
        yield duration
        buckets = [(str(le), n if v.cycle_duration_s <= le else 0) for le in CYCLE_BUCKETS_S]
        histogram = HistogramMetricFamily(
            PREFIX + "cycle_seconds",
            "each cycle",
            buckets=[*buckets, ("+Inf", n)],
            sum_value=n * v.cycle_duration_s,
        )
        yield histogram
        # Two queries per cycle (central mode's batched read), 5 ms each.
        query_buckets = [(str(le), 2 * n if le >= 0.005 else 0) for le in QUERY_BUCKETS_S]
        yield HistogramMetricFamily(
            PREFIX + "prometheus_query_seconds",
            "each query",
            buckets=[*query_buckets, ("+Inf", 2 * n)],
            sum_value=2 * n * 0.005,
        )
        last = GaugeMetricFamily(PREFIX + "last_successful_cycle_timestamp_seconds", "last ok")
        last.add_metric([], time.time() - v.last_success_age_s)
        yield last
        started = GaugeMetricFamily(PREFIX + "started_timestamp_seconds", "started")
        started.add_metric([], time.time() - (time.monotonic() - self.started))
        yield started
        build = GaugeMetricFamily(PREFIX + "build_info", "build", labels=["version"])
        build.add_metric(["0.1.0"], 1)
        yield build


class StubSizer:
    """One stub /metrics endpoint on 127.0.0.1 (an ephemeral port)."""

    def __init__(self, values: SizerValues | None = None) -> None:
        self.values = values or SizerValues()
        registry = CollectorRegistry()
        registry.register(StubCollector(self.values))
        self._server, self._thread = start_http_server(0, addr="127.0.0.1", registry=registry)
        self.address = f"127.0.0.1:{self._server.server_port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
