"""The README's metric tables say exactly what the code exports: every metric has a row, and each
label's values are the members of its enumeration."""

from __future__ import annotations

import re
from enum import StrEnum

import pytest
from prometheus_client import CollectorRegistry

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
from exporter.daemon.operation_metrics import CycleOutcome, SkippedEvent
from exporter.sizing.attainment import Bound
from exporter.sizing.headroom import HeadroomReason
from exporter.sizing.recommender import Reason
from exporter.sizing.slo_targets import BindingTarget
from exporter.sizing.traffic import LengthCvKind
from model import ServerConfig, TunerReason, TunerState
from tests.conftest import REPO_ROOT

LABEL_ENUMS: dict[str, type[StrEnum]] = {
    "vllm_sizer_recommendation_reason{reason}": Reason,
    "vllm_sizer_tuner_state{state}": TunerState,
    "vllm_sizer_tuner_reason{reason}": TunerReason,
    "vllm_sizer_fit_error_ratio{signal}": Signal,
    "vllm_sizer_binding_target{target}": BindingTarget,
    "vllm_sizer_headroom_reason{reason}": HeadroomReason,
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
}


def section(title: str) -> str:
    text = (REPO_ROOT / "README.md").read_text()
    start = text.index(f"\n{title}\n")
    following = re.search(r"\n#{2,3} ", text[start + len(title) + 2 :])
    end = start + len(title) + 2 + (following.start() if following else len(text))
    return text[start:end]


def table_rows(text: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows[1:] if rows else rows  # the header


def label_table(text: str) -> dict[str, set[str]]:
    return {
        row[0].strip("`"): set(re.findall(r"`([a-z_]+)`", row[1])) for row in table_rows(text)
    }


def exported_names() -> set[str]:
    registry = CollectorRegistry()
    dep = DeploymentConfig(
        name="d",
        model_name="m",
        source=SourceConfig(scrape_urls=("u",)),
        server=ServerConfig(),
        slo=SloConfig(ttft_ms=50.0),
    )
    Daemon(Config(deployments=(dep,)), {"d": object()}, registry, ManualClock())  # type: ignore[dict-item]
    registry.register(BuildInfoCollector("0"))
    suffix = {"counter": "_total", "info": "_info"}
    return {family.name + suffix.get(family.type, "") for family in registry.collect()}


def test_label_values_table_lists_exactly_each_enumeration() -> None:
    documented = label_table(section("### Label values"))
    assert set(documented) == set(LABEL_ENUMS)
    for key, enum in LABEL_ENUMS.items():
        assert documented[key] == {member.value for member in enum}, key


def test_every_exported_metric_has_a_readme_row() -> None:
    rows = table_rows(section("## Exported metrics"))
    documented = {name for row in rows for name in re.findall(r"vllm_sizer_\w+", row[0])}
    assert exported_names() - documented == set()
    assert documented - exported_names() == set(), "README lists a metric the code lacks"


def test_the_comparison_notices_a_missing_value() -> None:
    documented = label_table("| metric and label | values |\n|---|---|\n| `x{y}` | `ok` |\n")
    assert documented == {"x{y}": {"ok"}}
    assert documented["x{y}"] != {m.value for m in CycleOutcome}


@pytest.mark.parametrize("name", ["vllm_sizer_predicted_ttft_seconds"])
def test_readme_warns_against_scaling_on_infinite_predictions(name: str) -> None:
    (row,) = [r for r in table_rows(section("## Exported metrics")) if name in r[0]]
    assert "never scale on these" in row[1]
