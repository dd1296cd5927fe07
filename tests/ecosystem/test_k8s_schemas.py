"""Every manifest in config/k8s/ validates against its schema; a broken copy of each fails."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from tests.ecosystem.manifests import (
    CRD_FILES,
    K8S_DIR,
    Manifest,
    all_manifests,
    load_documents,
    manifest_files,
    schema_errors,
)

MANIFESTS = all_manifests()
IDS = [ident for ident, _ in MANIFESTS]

EXPECTED_KINDS = {
    "sidecar/deployment.yaml": ["Deployment"],
    "sidecar/configmap.yaml": ["ConfigMap"],
    "sidecar/podmonitor.yaml": ["PodMonitor"],
    "sidecar/service-headless.yaml": ["Service"],
    "central/deployment.yaml": ["Deployment"],
    "central/service.yaml": ["Service"],
    "central/configmap.yaml": ["ConfigMap"],
    "central/servicemonitor.yaml": ["ServiceMonitor"],
    "central/vllm-podmonitor.yaml": ["PodMonitor"],
    "keda-scaledobject.yaml": ["ScaledObject", "TriggerAuthentication"],
    "hpa.yaml": ["HorizontalPodAutoscaler", "ConfigMap"],
}


def test_the_expected_files_and_kinds_are_shipped() -> None:
    found = {
        path.relative_to(K8S_DIR).as_posix(): [doc["kind"] for doc in load_documents(path)]
        for path in manifest_files()
    }
    assert found == EXPECTED_KINDS


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.relative_to(K8S_DIR).as_posix())
def test_each_file_opens_with_a_comment_saying_what_it_is(path) -> None:
    assert path.read_text().startswith("# ")


@pytest.mark.parametrize("doc", [doc for _, doc in MANIFESTS], ids=IDS)
def test_manifest_validates_against_its_schema(doc: Manifest) -> None:
    assert schema_errors(doc) == []


def test_custom_kinds_are_checked_against_their_crds_not_skipped() -> None:
    kinds = {doc["kind"] for _, doc in MANIFESTS}
    assert set(CRD_FILES) <= kinds


# --- deliberately broken copies: each realistic mistake must fail the same check ---------------

Breaker = Callable[[Manifest], None]


def _first_container(doc: Manifest) -> dict:
    return doc["spec"]["template"]["spec"]["containers"][0]


def _rename(mapping: dict, old: str, new: str) -> None:
    mapping[new] = mapping.pop(old)


def _break_deployment_port_key(doc: Manifest) -> None:
    _rename(_first_container(doc), "ports", "port")


def _break_deployment_replicas_type(doc: Manifest) -> None:
    doc["spec"]["replicas"] = "two"


def _break_configmap_unquoted_number(doc: Manifest) -> None:
    doc["data"]["cycle_period_s"] = 30


def _break_service_port_missing(doc: Manifest) -> None:
    del doc["spec"]["ports"][0]["port"]


def _break_hpa_target_missing(doc: Manifest) -> None:
    del doc["spec"]["metrics"][0]["external"]["target"]


def _break_scaledobject_numeric_threshold(doc: Manifest) -> None:
    doc["spec"]["triggers"][0]["metadata"]["threshold"] = 1


def _break_scaledobject_auth_kind(doc: Manifest) -> None:
    doc["spec"]["triggers"][0]["authenticationRef"]["kind"] = "Secret"


def _break_scaledobject_api_version(doc: Manifest) -> None:
    doc["apiVersion"] = "keda.sh/v1"


def _break_triggerauth_key_missing(doc: Manifest) -> None:
    del doc["spec"]["secretTargetRef"][0]["key"]


def _break_servicemonitor_interval(doc: Manifest) -> None:
    doc["spec"]["endpoints"][0]["interval"] = "15 seconds"


def _break_servicemonitor_selector_missing(doc: Manifest) -> None:
    del doc["spec"]["selector"]


def _break_podmonitor_endpoints_key(doc: Manifest) -> None:
    _rename(doc["spec"], "podMetricsEndpoints", "endpoints")


def _break_misspelled_top_level_field(doc: Manifest) -> None:
    _rename(doc, "metadata", "metdata")


# kind -> [(breaker, text the first error must contain: the failure is for the intended reason)]
BREAKERS: dict[str, list[tuple[Breaker, str]]] = {
    "Deployment": [
        (_break_deployment_port_key, "'port' was unexpected"),
        (_break_deployment_replicas_type, "spec/replicas: 'two' is not of type 'integer'"),
    ],
    "ConfigMap": [(_break_configmap_unquoted_number, "30 is not of type 'string'")],
    "Service": [(_break_service_port_missing, "'port' is a required property")],
    "HorizontalPodAutoscaler": [(_break_hpa_target_missing, "'target' is a required property")],
    "ScaledObject": [
        (_break_scaledobject_numeric_threshold, "threshold: 1 is not of type 'string'"),
        (_break_scaledobject_auth_kind, "'Secret' is not one of"),
        (_break_scaledobject_api_version, "'keda.sh/v1' is not one of ['keda.sh/v1alpha1']"),
    ],
    "TriggerAuthentication": [(_break_triggerauth_key_missing, "'key' is a required property")],
    "ServiceMonitor": [
        (_break_servicemonitor_interval, "'15 seconds' does not match"),
        (_break_servicemonitor_selector_missing, "'selector' is a required property"),
    ],
    "PodMonitor": [(_break_podmonitor_endpoints_key, "'endpoints' was unexpected")],
}
GENERIC_BREAKER = (_break_misspelled_top_level_field, "'metdata' was unexpected")

BROKEN_CASES = [
    pytest.param(doc, breaker, needle, id=f"{ident}-{breaker.__name__.removeprefix('_break_')}")
    for ident, doc in MANIFESTS
    for breaker, needle in [*BREAKERS[doc["kind"]], GENERIC_BREAKER]
]


def test_every_shipped_kind_has_a_kind_specific_breakage() -> None:
    assert {doc["kind"] for _, doc in MANIFESTS} <= set(BREAKERS)


@pytest.mark.parametrize(("doc", "breaker", "needle"), BROKEN_CASES)
def test_broken_copy_fails_the_same_check(doc: Manifest, breaker: Breaker, needle: str) -> None:
    broken = copy.deepcopy(doc)
    breaker(broken)
    errors = schema_errors(broken)
    assert errors, f"{breaker.__name__} went unnoticed"
    assert needle in errors[0]
    assert schema_errors(doc) == []  # the original stays valid: the copy was deep
