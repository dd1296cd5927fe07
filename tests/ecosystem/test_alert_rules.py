"""The shipped alerting rules: parsed and unit-tested by promtool, identical in both shipped forms.

config/prometheus/vllm-sizer-alerts.yaml (plain rules file) and config/k8s/base/prometheusrule.yaml
(PrometheusRule) carry the same groups. `promtool test rules` runs the cases in
tests/ecosystem/rules/, each alert must have a firing case and a quiet one there, and deliberately
weakened copies of the rules must fail those cases (so the near misses really test something).
The CRD schema check of the PrometheusRule itself is in test_k8s_schemas.py; its broken copies are
repeated here next to the rules they are about.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from exporter.daemon.exposition import ENUM_GAUGES, GAUGES, PREFIX
from exporter.daemon.exposition_fleet import fleet_families
from exporter.daemon.operation_metrics import OperationMetrics
from tests.conftest import REPO_ROOT
from tests.ecosystem.manifests import find, schema_errors

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian prometheus) missing")

PLAIN_RULES = REPO_ROOT / "config" / "prometheus" / "vllm-sizer-alerts.yaml"
RULE_TESTS_DIR = REPO_ROOT / "tests" / "ecosystem" / "rules"
GROUP = "vllm-sizer"
SEVERITIES = {"critical", "warning", "info"}
ANNOTATIONS = {"summary", "description", "runbook"}
DURATION = re.compile(r"^([0-9]+)([smh])$")
SECONDS_PER = {"s": 1, "m": 60, "h": 3600}


def duration_s(text: str) -> int:
    """Seconds of a one-unit Prometheus duration such as `15m` (AssertionError otherwise)."""
    match = DURATION.fullmatch(text)
    assert match, f"not a one-unit duration: {text!r}"
    return int(match[1]) * SECONDS_PER[match[2]]


# Alert -> (its `for:`, a phrase its description must contain: the threshold it fires at).
EXPECTED_ALERTS = {
    "VllmSizerNoSuccessfulCycle": ("5m", "more than 60 s old"),
    "VllmSizerSourceDown": ("5m", "0 on every sizer copy for 5 minutes"),
    "VllmSizerSloInfeasible": ("15m", "slo_infeasible for 15 minutes"),
    "VllmSizerAtMaxReplicas": ("15m", "max_replicas for 15 minutes"),
    "VllmSizerTunerHolding": ("30m", "holding for 30 minutes"),
    "VllmSizerNotCalibrated": ("15m", "warming, for 15 minutes"),
    "VllmSizerPredictionOff": ("10m", "more than 1.5x the finite predicted"),
    "VllmSizerScaleUpNotHappening": ("10m", "above the ready replicas the sizer sees for 10"),
    "VllmSizerFleetDemandUnserved": ("10m", "has been above 0 for"),
    "VllmSizerInventoryExhausted": ("15m", "has reached vllm_sizer_fleet_gpus_available"),
}

Rule = dict[str, Any]


def plain_groups() -> list[dict[str, Any]]:
    return list(yaml.safe_load(PLAIN_RULES.read_text())["groups"])


def prometheusrule() -> dict[str, Any]:
    return find("PrometheusRule", "vllm-sizer", file="base/prometheusrule.yaml")


def alerts() -> dict[str, Rule]:
    (group,) = plain_groups()
    return {rule["alert"]: rule for rule in group["rules"]}


def rule_test_files() -> list[Path]:
    return sorted(RULE_TESTS_DIR.glob("*.test.yaml"))


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


# --- the two shipped forms --------------------------------------------------------------------


def test_prometheusrule_carries_exactly_the_plain_files_groups() -> None:
    doc = prometheusrule()
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(doc["spec"]) == {"groups"}
    assert doc["spec"]["groups"] == plain_groups()


def test_prometheusrule_is_selected_like_the_other_monitors() -> None:
    monitor = find("ServiceMonitor", "vllm-sizer")["metadata"]
    meta = prometheusrule()["metadata"]
    assert meta["namespace"] == monitor["namespace"]
    assert meta["labels"]["release"] == monitor["labels"]["release"] == "kube-prometheus-stack"


def test_one_group_with_the_expected_alerts() -> None:
    assert [group["name"] for group in plain_groups()] == [GROUP]
    assert list(alerts()) == list(EXPECTED_ALERTS)


@pytest.mark.parametrize("name", EXPECTED_ALERTS)
def test_alert_has_for_severity_and_annotations(name: str) -> None:
    rule = alerts()[name]
    expected_for, threshold = EXPECTED_ALERTS[name]
    assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}
    assert rule["for"] == expected_for and duration_s(rule["for"]) > 0
    assert rule["labels"]["severity"] in SEVERITIES
    assert set(rule["annotations"]) == ANNOTATIONS
    assert all(text.strip() for text in rule["annotations"].values())
    assert threshold in rule["annotations"]["description"]


def test_for_durations_are_what_the_descriptions_say() -> None:
    for name, rule in alerts().items():
        minutes = duration_s(rule["for"]) // 60
        assert f"{minutes} minutes" in rule["annotations"]["description"], name


def _exported_series_names() -> set[str]:
    names = {PREFIX + spec.name for spec in GAUGES} | {PREFIX + e.name for e in ENUM_GAUGES}
    registry = CollectorRegistry()
    OperationMetrics(registry, [])
    names |= {sample.name for family in registry.collect() for sample in family.samples}
    names |= {family.name for family in registry.collect()}
    names |= {family.name for family in fleet_families(None)}
    return names


def test_rules_use_only_exported_metrics_and_label_values() -> None:
    exported = _exported_series_names()
    enum_values = {(PREFIX + s.name, s.label): {m.value for m in s.values} for s in ENUM_GAUGES}
    for name, rule in alerts().items():
        used = set(re.findall(r"\bvllm_sizer_[a-z_]+", rule["expr"]))
        assert used and used <= exported, (name, used - exported)
        for metric, label, value in re.findall(
            r"\b(vllm_sizer_[a-z_]+)\{(\w+)=\"(\w+)\"\}", rule["expr"]
        ):
            assert value in enum_values[(metric, label)], (name, metric, label, value)


def test_per_deployment_rules_fold_sizer_copies_with_max() -> None:
    # Sidecar mode: every copy exports the same deployment; folding must never sum them.
    for name, rule in alerts().items():
        if name == "VllmSizerNoSuccessfulCycle":  # per target on purpose: one stuck copy matters
            continue
        selectors = re.findall(r"\bvllm_sizer_[a-z_]+", rule["expr"])
        # The fleet's series are per model or per accelerator type, folded the same way.
        folds = re.findall(
            r"max by \(namespace, (?:deployment|model_name|accelerator)\) \(vllm_sizer_",
            rule["expr"],
        )
        assert len(folds) == len(selectors), name
        assert "sum" not in rule["expr"], name


def test_prediction_off_compares_only_finite_predictions() -> None:
    # `x > 1.5 * +Inf` is false anyway; the explicit filter, applied after folding the copies,
    # keeps a saturated (+Inf) prediction out of the comparison whatever form it takes later.
    expr = alerts()["VllmSizerPredictionOff"]["expr"]
    for signal in ("ttft", "itl"):
        predicted = f"max by (namespace, deployment) (vllm_sizer_predicted_{signal}_seconds)"
        assert f"> 1.5 * ({predicted} < +Inf)" in expr


# --- promtool ---------------------------------------------------------------------------------


@needs_promtool
def test_plain_rules_file_passes_promtool_check() -> None:
    proc = promtool("check", "rules", PLAIN_RULES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(EXPECTED_ALERTS)} rules found" in proc.stdout


@needs_promtool
def test_a_broken_rules_file_fails_promtool_check(tmp_path: Path) -> None:
    groups = plain_groups()
    groups[0]["rules"][0]["for"] = "5 minutes"
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    assert promtool("check", "rules", broken).returncode != 0


def test_there_are_rule_test_files() -> None:
    assert rule_test_files()


@needs_promtool
@pytest.mark.parametrize("path", rule_test_files(), ids=lambda p: p.name)
def test_promtool_rule_unit_tests_pass(path: Path) -> None:
    proc = promtool("test", "rules", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def _alert_checks() -> list[tuple[str, bool]]:
    """(alertname, fires) for every alert_rule_test entry of every rule test file."""
    out = []
    for path in rule_test_files():
        suite = yaml.safe_load(path.read_text())
        assert [(path.parent / f).resolve() for f in suite["rule_files"]] == [PLAIN_RULES]
        for case in suite["tests"]:
            for check in case.get("alert_rule_test", []):
                out.append((check["alertname"], bool(check.get("exp_alerts"))))
    return out


@pytest.mark.parametrize("name", EXPECTED_ALERTS)
def test_each_alert_has_a_firing_case_and_a_quiet_case(name: str) -> None:
    checks = _alert_checks()
    assert (name, True) in checks
    assert (name, False) in checks
    assert {alert for alert, _ in checks} <= set(EXPECTED_ALERTS)


# Weakened rules the unit tests must catch: each near miss exists for a reason.
Mutation = Callable[[str, Rule], None]


def _filter_infinite_before_folding(name: str, rule: Rule) -> None:
    # A copy predicting +Inf would drop out and leave another copy's finite prediction.
    rule["expr"] = re.sub(
        r"\(max by \(namespace, deployment\) \((vllm_sizer_predicted_\w+)\) < \+Inf\)",
        r"max by (namespace, deployment) (\1 < +Inf)",
        rule["expr"],
    )


def _shorten_every_for(name: str, rule: Rule) -> None:
    rule["for"] = f"{duration_s(rule['for']) - 60}s"


def _fold_with_min(name: str, rule: Rule) -> None:
    rule["expr"] = rule["expr"].replace("max by", "min by")


def _forget_sidecar_targets(name: str, rule: Rule) -> None:
    rule["expr"] = rule["expr"].replace('endpoint="sizer-metrics"', 'endpoint="nowhere"')


def _ignore_never_succeeded(name: str, rule: Rule) -> None:
    if name == "VllmSizerNoSuccessfulCycle":
        rule["expr"] = rule["expr"].replace(
            "vllm_sizer_last_successful_cycle_timestamp_seconds > 60",
            "(vllm_sizer_last_successful_cycle_timestamp_seconds > 0) > 60",
        )


def _source_down_at_zero(name: str, rule: Rule) -> None:
    # Without the exception, a deployment at zero replicas (no pod to read) pages.
    if name == "VllmSizerSourceDown":
        rule["expr"] = rule["expr"].split(" unless ")[0]


def _source_down_while_coming_back(name: str, rule: Rule) -> None:
    # Excusing the way back too would hide pods that never come up.
    if name == "VllmSizerSourceDown":
        rule["expr"] = rule["expr"].replace("scaled_to_zero|", "scaled_to_zero|demand_from_zero|")


MUTATIONS = [
    _source_down_at_zero,
    _source_down_while_coming_back,
    _filter_infinite_before_folding,
    _shorten_every_for,
    _fold_with_min,
    _forget_sidecar_targets,
    _ignore_never_succeeded,
]


@needs_promtool
@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.__name__.removeprefix("_"))
def test_weakened_rules_fail_the_unit_tests(mutation: Mutation, tmp_path: Path) -> None:
    groups = copy.deepcopy(plain_groups())
    for rule in groups[0]["rules"]:
        mutation(rule["alert"], rule)
    assert groups != plain_groups(), "the mutation changed nothing"
    rules = tmp_path / "mutated-rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    assert promtool("check", "rules", rules).returncode == 0  # still valid, only weaker
    for path in rule_test_files():
        suite = yaml.safe_load(path.read_text())
        suite["rule_files"] = [str(rules)]
        (tmp_path / path.name).write_text(yaml.safe_dump(suite, sort_keys=False))
    procs = [promtool("test", "rules", tmp_path / p.name) for p in rule_test_files()]
    assert any(proc.returncode != 0 for proc in procs), f"{mutation.__name__} went unnoticed"


# --- the PrometheusRule against its CRD -------------------------------------------------------


def test_prometheusrule_validates_against_its_crd() -> None:
    assert schema_errors(prometheusrule()) == []


def _first_rule(doc: dict[str, Any]) -> Rule:
    rule: Rule = doc["spec"]["groups"][0]["rules"][0]
    return rule


BROKEN_RULES: list[tuple[Callable[[dict[str, Any]], None], str]] = [
    (lambda doc: _first_rule(doc).update({"for": "5 minutes"}), "'5 minutes' does not match"),
    (lambda doc: _first_rule(doc).update({"severity": "critical"}), "'severity' was unexpected"),
    (lambda doc: _first_rule(doc).update({"annotation": {}}), "'annotation' was unexpected"),
    (lambda doc: _first_rule(doc).pop("expr"), "'expr' is a required property"),
    (lambda doc: doc["spec"]["groups"][0].pop("name"), "'name' is a required property"),
    (lambda doc: doc["spec"].update({"group": []}), "'group' was unexpected"),
    (lambda doc: doc.update({"apiVersion": "monitoring.coreos.com/v1beta1"}), "is not one of"),
]


@pytest.mark.parametrize(("breaker", "needle"), BROKEN_RULES, ids=[n for _, n in BROKEN_RULES])
def test_broken_prometheusrule_fails_the_crd_schema(
    breaker: Callable[[dict[str, Any]], None], needle: str
) -> None:
    broken = copy.deepcopy(prometheusrule())
    breaker(broken)
    errors = schema_errors(broken)
    assert errors and needle in errors[0], errors
