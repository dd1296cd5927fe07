"""Metric conventions of the exposition: enum-style state, ratios, health gauges, counters at 0."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.base.clock import ManualClock
from exporter.base.errors import FailureReason
from exporter.collector.pod_observation import Problem
from exporter.config.values import Config, DemandKind, DeploymentConfig, SloConfig, SourceConfig
from exporter.daemon.daemon import Daemon
from exporter.daemon.exposition import (
    CycleSnapshot,
    DeploymentStatus,
    Signal,
    SnapshotCollector,
)
from exporter.daemon.operation_metrics import CycleOutcome, SkippedEvent
from exporter.sizing.forecasters import ForecasterName
from exporter.sizing.reasons import Reason
from exporter.sizing.recommender import (
    MAX_HEADROOM_RATIO,
    Decision,
    saturated,
    slo_headroom_ratio,
)
from model import ServerConfig, ServiceParams, TunerReason, TunerState
from tests.exporter.daemon.test_daemon import FleetSource, fleet  # noqa: F401  (fixture)

LLAMA = ServiceParams(6.68, 2.01e-2, 5.52e-5)
KEY = {"deployment": "llama", "model_name": "llama"}


def decision(**changes: object) -> Decision:
    base = Decision(
        desired_replicas=2,
        reason=Reason.AT_TARGET,
        message="",
        current_replicas=2,
        model_replicas=2,
        arrival_rate_rps=8.0,
        sizing_rate_rps=8.0,
        max_rate_per_replica_rps=6.0,
        saturation_rate_per_replica_rps=12.0,
        predicted_ttft_ms=40.0,
        predicted_itl_ms=9.0,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def status(**changes: object) -> DeploymentStatus:
    base = DeploymentStatus(
        deployment="llama",
        model_name="llama",
        decision=decision(),
        params=LLAMA,
        tuner_state=TunerState.FITTED,
        tuner_reason=TunerReason.ACCEPTED,
        fit_ttft_error=0.05,
        fit_itl_error=0.02,
        observed_ttft_ms=41.0,
        observed_itl_ms=9.2,
        slo_ttft_ms=60.0,
        slo_itl_ms=20.0,
        source_up=True,
        pods_observed=2,
        saturated=False,
        slo_headroom_ratio=1.5,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def exposition(*statuses: DeploymentStatus) -> CollectorRegistry:
    registry = CollectorRegistry()
    collector = SnapshotCollector()
    registry.register(collector)
    collector.publish(CycleSnapshot(tuple(statuses)))
    return registry


@pytest.mark.parametrize(
    ("name", "label", "values", "current"),
    [
        ("recommendation_reason", "reason", Reason, Reason.STABILIZING),
        ("tuner_state", "state", TunerState, TunerState.HOLDING),
        ("tuner_reason", "reason", TunerReason, TunerReason.UNIDENTIFIED),
    ],
)
def test_state_is_one_series_per_known_value_with_the_current_at_1(
    name: str, label: str, values: type, current: object
) -> None:
    registry = exposition(
        status(
            decision=decision(reason=Reason.STABILIZING),
            tuner_state=TunerState.HOLDING,
            tuner_reason=TunerReason.UNIDENTIFIED,
        )
    )
    seen = {
        v.value: registry.get_sample_value("vllm_sizer_" + name, {**KEY, label: v.value})
        for v in values
    }
    assert seen == {v.value: (1.0 if v is current else 0.0) for v in values}


def test_no_info_metric_carries_changing_state() -> None:
    text = generate_latest(exposition(status())).decode()
    assert "_info" not in text
    assert "fit_relative_error" not in text


def test_fit_error_is_a_ratio_labelled_by_signal() -> None:
    registry = exposition(status(fit_ttft_error=0.05, fit_itl_error=None))
    ttft = {**KEY, "signal": Signal.TTFT.value}
    assert registry.get_sample_value("vllm_sizer_fit_error_ratio", ttft) == 0.05
    itl = {**KEY, "signal": Signal.ITL.value}
    assert registry.get_sample_value("vllm_sizer_fit_error_ratio", itl) is None


def test_confidence_and_parameter_sources() -> None:
    registry = exposition(status(calibration_confidence=0.83, identified=(True, True, False)))
    assert registry.get_sample_value("vllm_sizer_calibration_confidence", KEY) == 0.83
    seen = {
        (p, src): registry.get_sample_value(
            "vllm_sizer_parameter_source", {**KEY, "parameter": p, "source": src}
        )
        for p in ("alpha", "beta", "gamma")
        for src in ("data", "prior")
    }
    assert seen == {
        ("alpha", "data"): 1.0, ("alpha", "prior"): 0.0,
        ("beta", "data"): 1.0, ("beta", "prior"): 0.0,
        ("gamma", "data"): 0.0, ("gamma", "prior"): 1.0,
    }  # fmt: skip
    assert registry.get_sample_value("vllm_sizer_extrapolation_ratio", KEY) is None
    beyond = exposition(status(extrapolation_ratio=1.8))
    assert beyond.get_sample_value("vllm_sizer_extrapolation_ratio", KEY) == 1.8
    # Warming: a confidence of 0 and no parameter to say anything about.
    warming = exposition(status(params=None, identified=None))
    assert warming.get_sample_value("vllm_sizer_calibration_confidence", KEY) == 0.0
    text = generate_latest(warming).decode()
    assert "vllm_sizer_parameter_source{" not in text


def test_health_gauges_are_zero_one_and_counts() -> None:
    registry = exposition(status(source_up=False, pods_observed=0, saturated=True))
    assert registry.get_sample_value("vllm_sizer_source_up", KEY) == 0.0
    assert registry.get_sample_value("vllm_sizer_pods_observed", KEY) == 0.0
    assert registry.get_sample_value("vllm_sizer_saturated", KEY) == 1.0
    unknown = exposition(status(saturated=None, slo_headroom_ratio=None))
    assert unknown.get_sample_value("vllm_sizer_saturated", KEY) is None
    assert unknown.get_sample_value("vllm_sizer_slo_headroom_ratio", KEY) is None


def test_headroom_is_capacity_over_load_finite_and_zero_when_saturated() -> None:
    assert slo_headroom_ratio(decision()) == pytest.approx(6.0 * 2 / 8.0)
    assert slo_headroom_ratio(decision(predicted_ttft_ms=math.inf)) == 0.0
    assert slo_headroom_ratio(decision(arrival_rate_rps=0.0)) == MAX_HEADROOM_RATIO
    assert slo_headroom_ratio(decision(arrival_rate_rps=1e-9)) == MAX_HEADROOM_RATIO
    assert slo_headroom_ratio(decision(max_rate_per_replica_rps=0.0)) == 0.0  # infeasible SLO
    assert slo_headroom_ratio(decision(max_rate_per_replica_rps=None)) is None


def test_saturated_by_the_model_or_by_the_observed_backlog() -> None:
    assert saturated(decision(predicted_ttft_ms=math.inf), None) is True
    assert saturated(decision(), None) is False
    assert saturated(decision(predicted_ttft_ms=None), None) is None


# -- through the daemon ------------------------------------------------------------------------


def config(source: SourceConfig) -> Config:
    dep = DeploymentConfig(
        name="llama", model_name="llama", source=source, server=ServerConfig(),
        slo=SloConfig(ttft_ms=60.0, itl_ms=20.0), initial_params=LLAMA,
    )  # fmt: skip
    return Config(cycle_period_s=30.0, deployments=(dep,))


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        (SourceConfig(scrape_urls=("http://x:1/",)), "scrape"),
        (SourceConfig(prometheus_selector='{job="vllm"}'), "prometheus"),
    ],
)
def test_every_error_label_exists_at_zero_before_the_first_cycle(
    source: SourceConfig, kind: str
) -> None:
    registry = CollectorRegistry()
    Daemon(config(source), {"llama": FleetSource.__new__(FleetSource)}, registry, ManualClock())
    for reason in FailureReason:
        labels = {"deployment": "llama", "source": kind, "reason": reason.value}
        assert registry.get_sample_value("vllm_sizer_scrape_errors_total", labels) == 0.0, reason
    for problem in Problem:
        labels = {"deployment": "llama", "problem": problem.value}
        assert registry.get_sample_value("vllm_sizer_observation_problems_total", labels) == 0.0
    for outcome in CycleOutcome:
        assert registry.get_sample_value("vllm_sizer_cycles_total", {"outcome": outcome}) == 0.0
    for event in SkippedEvent:
        labels = {"event": event.value}
        assert registry.get_sample_value("vllm_sizer_cycles_skipped_total", labels) == 0.0


def outcomes(registry: CollectorRegistry) -> dict[str, float | None]:
    return {
        outcome: registry.get_sample_value("vllm_sizer_cycles_total", {"outcome": outcome})
        for outcome in ("ok", "warming_up", "failed")
    }


def test_cycles_fill_the_duration_histogram_and_the_source_gauges(fleet) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    emulated, clock = fleet
    registry = CollectorRegistry()
    source = FleetSource(emulated)
    wall = ManualClock(1.7e9)
    daemon = Daemon(
        config(SourceConfig(scrape_urls=("http://x:1/",))), {"llama": source}, registry,
        emulated.sim_clock, wall_clock=wall,
    )  # fmt: skip
    for _ in range(3):
        for _ in range(30):
            clock.advance(1.0)
            emulated.sync()
        wall.advance(0.25)
        daemon.run_cycle()
    assert registry.get_sample_value("vllm_sizer_cycle_seconds_count") == 3.0
    assert registry.get_sample_value("vllm_sizer_source_up", KEY) == 1.0
    assert registry.get_sample_value("vllm_sizer_pods_observed", KEY) == 2.0
    # Exported timestamps follow the wall clock, not the clock the cycle runs on.
    stamp = registry.get_sample_value("vllm_sizer_last_successful_cycle_timestamp_seconds")
    assert stamp == pytest.approx(1.7e9 + 0.75)
    # The first cycle has no window yet: warming up, not a failure.
    assert outcomes(registry) == {"ok": 2.0, "warming_up": 1.0, "failed": 0.0}
    source.down = True
    daemon.run_cycle()
    assert registry.get_sample_value("vllm_sizer_source_up", KEY) == 0.0
    assert registry.get_sample_value("vllm_sizer_pods_observed", KEY) == 0.0
    labels = {"deployment": "llama", "source": "scrape", "reason": "connection"}
    assert registry.get_sample_value("vllm_sizer_scrape_errors_total", labels) == 1.0
    assert outcomes(registry) == {"ok": 2.0, "warming_up": 1.0, "failed": 1.0}
    families = {f.name for f in text_string_to_metric_families(generate_latest(registry).decode())}
    assert "vllm_sizer_cycle_seconds" in families


def test_demand_is_exported_with_its_kind_and_omitted_when_unknown() -> None:
    registry = exposition(
        status(demand=2.5, demand_kind=DemandKind.RATE),
        status(deployment="queued", demand=7.0, demand_kind=DemandKind.QUEUE),
        status(deployment="failing", demand=None, demand_kind=DemandKind.RATE),
        status(deployment="plain"),  # no scale_from_zero
    )
    samples = {
        (s.labels["deployment"], s.labels["kind"]): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        if family.name == "vllm_sizer_demand"
        for s in family.samples
    }
    assert samples == {("llama", "rate"): 2.5, ("queued", "queue"): 7.0}


def test_a_source_down_from_the_start_fails_its_cycles_until_it_answers(fleet) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    emulated, clock = fleet
    registry = CollectorRegistry()
    source = FleetSource(emulated, down=True)
    daemon = Daemon(
        config(SourceConfig(scrape_urls=("http://x:1/",))), {"llama": source}, registry,
        emulated.sim_clock,
    )  # fmt: skip
    for down in (True, True, False, False):
        source.down = down
        clock.advance(30.0)
        emulated.sync()
        daemon.run_cycle()
    # Failed twice, then a first read (warming up), then a window.
    assert outcomes(registry) == {"ok": 1.0, "warming_up": 1.0, "failed": 2.0}
    assert daemon.ready()


def test_the_forecaster_its_horizon_and_recent_error_are_exported_once_read() -> None:
    registry = exposition(
        status(
            forecaster=ForecasterName.HOLT_WINTERS,
            forecast_horizon_s=300.0,
            forecast_error_ratio=0.08,
        )
    )
    seen = {
        f.value: registry.get_sample_value("vllm_sizer_forecaster", {**KEY, "forecaster": f.value})
        for f in ForecasterName
    }
    assert seen == {f.value: float(f is ForecasterName.HOLT_WINTERS) for f in ForecasterName}
    assert registry.get_sample_value("vllm_sizer_forecast_horizon_seconds", KEY) == 300.0
    assert registry.get_sample_value("vllm_sizer_forecast_error_ratio", KEY) == 0.08
    unread = exposition(status())  # before a window's rate was read: no series at all
    assert unread.get_sample_value("vllm_sizer_forecast_horizon_seconds", KEY) is None
    assert all(
        unread.get_sample_value("vllm_sizer_forecaster", {**KEY, "forecaster": f.value}) is None
        for f in ForecasterName
    )
