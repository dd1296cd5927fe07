"""docs/reference/metrics-generated.md and metric-labels-generated.md: every exported metric
family (name, type, labels, help) as the daemon's registry describes it, and every label's values
from the enumeration behind it."""

from __future__ import annotations

from enum import StrEnum

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from exporter.base.clock import ManualClock
from exporter.base.errors import FailureReason
from exporter.collector.pod_observation import Problem
from exporter.config.values import (
    Config,
    DemandKind,
    DeploymentConfig,
    ItlKind,
    SloConfig,
    SourceConfig,
    SourceKind,
)
from exporter.daemon.daemon import Daemon
from exporter.daemon.exposition import BuildInfoCollector, Parameter, ParameterSource, Signal
from exporter.daemon.operation_metrics import CycleOutcome, QueryMetrics, SkippedEvent
from exporter.daemon.replica_label import register_start
from exporter.sizing.attainment import Bound
from exporter.sizing.fleet.values import PlanReason
from exporter.sizing.forecasters import ForecasterName
from exporter.sizing.headroom import HeadroomReason
from exporter.sizing.reasons import Reason
from exporter.sizing.slo_targets import BindingTarget
from exporter.sizing.traffic import LengthCvKind
from model import ServerConfig, TunerReason, TunerState
from tools.docs_gen.config_keys import HEADER

# metric{label} -> the enumeration whose members are the label's values.
LABEL_ENUMS: dict[str, type[StrEnum]] = {
    "vllm_sizer_recommendation_reason{reason}": Reason,
    "vllm_sizer_tuner_state{state}": TunerState,
    "vllm_sizer_tuner_reason{reason}": TunerReason,
    "vllm_sizer_fit_error_ratio{signal}": Signal,
    "vllm_sizer_binding_target{target}": BindingTarget,
    "vllm_sizer_predicted_itl_quantile_seconds{kind}": ItlKind,
    "vllm_sizer_slo_itl_quantile_seconds{kind}": ItlKind,
    "vllm_sizer_observed_slo_attainment_ratio{bound}": Bound,
    "vllm_sizer_demand{kind}": DemandKind,
    "vllm_sizer_request_length_cv{kind}": LengthCvKind,
    "vllm_sizer_parameter_source{parameter}": Parameter,
    "vllm_sizer_parameter_source{source}": ParameterSource,
    "vllm_sizer_scrape_errors_total{source}": SourceKind,
    "vllm_sizer_scrape_errors_total{reason}": FailureReason,
    "vllm_sizer_observation_problems_total{problem}": Problem,
    "vllm_sizer_cycles_total{outcome}": CycleOutcome,
    "vllm_sizer_cycles_skipped_total{event}": SkippedEvent,
    "vllm_sizer_headroom_reason{reason}": HeadroomReason,
    "vllm_sizer_fleet_plan_reason{reason}": PlanReason,
    "vllm_sizer_inventory_read_errors_total{reason}": FailureReason,
    "vllm_sizer_forecaster{forecaster}": ForecasterName,
}
# Labels whose values are not an enumeration: names and numbers from the configuration.
FREE_LABELS = {
    "deployment": "the configured deployment name",
    "model_name": "the configured `model_name`",
    "percentile": "a configured percentile, e.g. `95` or `99.9`",
    "target": "a configured percentile target, e.g. `ttft_p95` (a `binding_target` value on "
    "`vllm_sizer_binding_target`)",
    "version": "the package version",
    "le": "a histogram bucket bound",
    "accelerator": "a configured accelerator type (`accelerators`), e.g. `H100`",
}
SUFFIX = {"counter": "_total", "info": "_info"}


def families() -> list[Metric]:
    """The registry of a daemon with one deployment, before its first cycle, and build info."""
    registry = CollectorRegistry()
    dep = DeploymentConfig(
        name="d",
        model_name="m",
        source=SourceConfig(scrape_urls=("http://127.0.0.1:1/metrics",)),
        server=ServerConfig(),
        slo=SloConfig(ttft_ms=50.0),
    )
    Daemon(Config(deployments=(dep,)), {"d": object()}, registry, ManualClock())  # type: ignore[dict-item]
    registry.register(BuildInfoCollector("0"))
    QueryMetrics(registry)  # registered by `run` beside the daemon's own
    register_start(registry, 0.0)
    return list(registry.collect())


def exported_name(family: Metric) -> str:
    return family.name + SUFFIX.get(family.type, "")


def label_names(family: Metric) -> tuple[str, ...]:
    """The family's labels: declared ones (custom collector), else those of its samples."""
    declared: tuple[str, ...] | None = getattr(family, "_labelnames", None)
    if declared:
        return tuple(declared)
    seen: dict[str, None] = {}
    for sample in family.samples:
        seen.update(dict.fromkeys(sample.labels))
    return tuple(seen)


def render() -> str:
    lines = [
        HEADER,
        "# Metrics",
        "",
        "Every exported family, as the registry describes it; each enumerated label's values:",
        "[label values](metric-labels-generated.md). What each means: [metrics](metrics.md); what",
        "a state or reason asks of you: [troubleshooting](../operate/troubleshooting.md).",
        "",
        "| metric | type | labels | help |",
        "|---|---|---|---|",
    ]
    for family in families():
        labels = ", ".join(f"`{name}`" for name in label_names(family))
        text = family.documentation.replace("|", "\\|")
        lines.append(f"| `{exported_name(family)}` | {family.type} | {labels} | {text} |")
    return "\n".join(lines) + "\n"


def render_labels() -> str:
    """docs/reference/metric-labels-generated.md: each enumerated label's values (a page of its
    own, so the families' page keeps within the page size as metrics are added)."""
    lines = [
        HEADER,
        "# Metric label values",
        "",
        "Each enumerated label's values, from the enumeration behind it. The families:",
        "[metrics (generated)](metrics-generated.md).",
        "",
        "| metric and label | values |",
        "|---|---|",
    ]
    for key, enum in LABEL_ENUMS.items():
        lines.append(f"| `{key}` | " + ", ".join(f"`{m.value}`" for m in enum) + " |")
    lines += ["", "Labels without a fixed set of values:", ""]
    lines += [f"- `{name}`: {meaning}" for name, meaning in FREE_LABELS.items()]
    return "\n".join(lines) + "\n"


def unlisted_labels() -> list[str]:
    """metric{label} pairs exported but neither in LABEL_ENUMS nor free."""
    return sorted(
        f"{exported_name(f)}{{{name}}}"
        for f in families()
        for name in label_names(f)
        if name not in FREE_LABELS and f"{exported_name(f)}{{{name}}}" not in LABEL_ENUMS
    )
