"""Every manifest in config/k8s/ validates against its schema; a broken copy of each fails."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from tests.conftest import REPO_ROOT
from tests.ecosystem.manifests import (
    CRD_FILES,
    HPA_TOLERANCE_PATCH,
    K8S_DIR,
    Manifest,
    all_manifests,
    bundled_kubernetes_versions,
    find,
    kubernetes_errors,
    load_documents,
    load_patch,
    manifest_files,
    merge_patch,
    patch_files,
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
    "central-ha/statefulset.yaml": ["StatefulSet"],
    "central-ha/pdb.yaml": ["PodDisruptionBudget"],
    "base/keda-scaledobject.yaml": ["ScaledObject", "TriggerAuthentication"],
    "fleet-scaledobjects.yaml": ["ScaledObject", "ScaledObject"],
    "scale-to-zero/keda-scaledobject-scale-to-zero.yaml": ["ScaledObject"],
    "hpa.yaml": ["HorizontalPodAutoscaler", "ConfigMap"],
    "base/prometheusrule.yaml": ["PrometheusRule"],
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


def _break_statefulset_selector_missing(doc: Manifest) -> None:
    del doc["spec"]["selector"]


def _break_pdb_min_available_type(doc: Manifest) -> None:
    doc["spec"]["minAvailable"] = ["1"]


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


def _break_scaledobject_min_replicas_type(doc: Manifest) -> None:
    doc["spec"]["minReplicaCount"] = "0"


def _break_triggerauth_key_missing(doc: Manifest) -> None:
    del doc["spec"]["secretTargetRef"][0]["key"]


def _break_servicemonitor_interval(doc: Manifest) -> None:
    doc["spec"]["endpoints"][0]["interval"] = "15 seconds"


def _break_servicemonitor_selector_missing(doc: Manifest) -> None:
    del doc["spec"]["selector"]


def _break_podmonitor_endpoints_key(doc: Manifest) -> None:
    _rename(doc["spec"], "podMetricsEndpoints", "endpoints")


def _first_alert(doc: Manifest) -> dict:
    return doc["spec"]["groups"][0]["rules"][0]


def _break_prometheusrule_for_duration(doc: Manifest) -> None:
    _first_alert(doc)["for"] = "5 minutes"


def _break_prometheusrule_severity_field(doc: Manifest) -> None:
    # The severity belongs under `labels:`; a rule has no such field.
    _first_alert(doc)["severity"] = _first_alert(doc)["labels"].pop("severity")


def _break_misspelled_top_level_field(doc: Manifest) -> None:
    _rename(doc, "metadata", "metdata")


# kind -> [(breaker, text the first error must contain: the failure is for the intended reason)]
BREAKERS: dict[str, list[tuple[Breaker, str]]] = {
    "Deployment": [
        (_break_deployment_port_key, "'port' was unexpected"),
        (_break_deployment_replicas_type, "spec/replicas: 'two' is not of type 'integer'"),
    ],
    "StatefulSet": [
        (_break_deployment_port_key, "'port' was unexpected"),
        (_break_deployment_replicas_type, "spec/replicas: 'two' is not of type 'integer'"),
        (_break_statefulset_selector_missing, "'selector' is a required property"),
    ],
    "PodDisruptionBudget": [(_break_pdb_min_available_type, "spec/minAvailable: ['1']")],
    "ConfigMap": [(_break_configmap_unquoted_number, "30 is not of type 'string'")],
    "Service": [(_break_service_port_missing, "'port' is a required property")],
    "HorizontalPodAutoscaler": [(_break_hpa_target_missing, "'target' is a required property")],
    "ScaledObject": [
        (_break_scaledobject_numeric_threshold, "threshold: 1 is not of type 'string'"),
        (_break_scaledobject_auth_kind, "'Secret' is not one of"),
        (_break_scaledobject_api_version, "'keda.sh/v1' is not one of ['keda.sh/v1alpha1']"),
        (_break_scaledobject_min_replicas_type, "minReplicaCount: '0' is not of type 'integer'"),
    ],
    "TriggerAuthentication": [(_break_triggerauth_key_missing, "'key' is a required property")],
    "ServiceMonitor": [
        (_break_servicemonitor_interval, "'15 seconds' does not match"),
        (_break_servicemonitor_selector_missing, "'selector' is a required property"),
    ],
    "PodMonitor": [(_break_podmonitor_endpoints_key, "'endpoints' was unexpected")],
    "PrometheusRule": [
        (_break_prometheusrule_for_duration, "'5 minutes' does not match"),
        (_break_prometheusrule_severity_field, "'severity' was unexpected"),
    ],
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


# --- HPA tolerance: hpa.yaml applies everywhere, the patch adds the field where it exists ---------

# The newest Kubernetes whose autoscaling/v2 HPAScalingRules has no `tolerance` (the field arrived,
# alpha, in 1.33): kubectl's default strict validation rejects the field there.
LAST_WITHOUT_TOLERANCE = "1.32"
TOLERANCE_PATHS = {
    ("spec", "behavior", "scaleUp", "tolerance"),
    ("spec", "behavior", "scaleDown", "tolerance"),
}
PATCH_COMMAND = "kubectl patch hpa {name} -n {namespace} --type merge --patch-file {path}"


def _hpa() -> Manifest:
    return find("HorizontalPodAutoscaler", file="hpa.yaml")


def _patched_hpa() -> Manifest:
    return merge_patch(_hpa(), load_patch(HPA_TOLERANCE_PATCH))


def _leaves(node: object, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], object]:
    """Path -> value of every non-mapping value in a nested mapping."""
    if not isinstance(node, dict):
        return {prefix: node}
    return {
        path: v for key, value in node.items() for path, v in _leaves(value, (*prefix, key)).items()
    }


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def test_patch_files_are_the_hpa_tolerance_patch_and_the_ha_overlays() -> None:
    # Patch files are left out of the manifest checks above; each must be covered elsewhere: the
    # HPA's here, the central-ha overlay's by its render (test_kustomize.py).
    ha = K8S_DIR / "central-ha"
    assert patch_files() == sorted(
        [
            HPA_TOLERANCE_PATCH,
            ha / "deployment-delete-patch.yaml",
            ha / "scaledobject-ha-patch.yaml",
        ]
    )
    assert all(path.read_text().startswith("# ") for path in patch_files())


def test_kubernetes_validate_bundles_versions_on_both_sides_of_the_tolerance_field() -> None:
    versions = bundled_kubernetes_versions()
    assert LAST_WITHOUT_TOLERANCE in versions
    assert _minor(versions[-1]) > _minor(LAST_WITHOUT_TOLERANCE)


@pytest.mark.parametrize("version", bundled_kubernetes_versions())
def test_hpa_yaml_applies_strictly_on_every_bundled_kubernetes_version(version: str) -> None:
    # Strict like `kubectl apply --validate=strict` (kubectl's default): unknown fields fail.
    assert kubernetes_errors(_hpa(), version) == []


def test_hpa_yaml_carries_no_tolerance_anywhere() -> None:
    assert not [path for path in _leaves(_hpa()) if "tolerance" in path]


@pytest.mark.parametrize("version", bundled_kubernetes_versions())
def test_patched_hpa_is_rejected_exactly_where_the_field_does_not_exist(version: str) -> None:
    errors = kubernetes_errors(_patched_hpa(), version)
    if _minor(version) <= _minor(LAST_WITHOUT_TOLERANCE):
        # Why the patch is a separate file: this is what `kubectl apply` says on <= 1.32.
        assert len(errors) == 1 and "'tolerance' was unexpected" in errors[0], errors
    else:
        assert errors == []


def test_patched_hpa_validates_on_the_newest_bundled_kubernetes() -> None:
    newest = bundled_kubernetes_versions()[-1]
    assert kubernetes_errors(_patched_hpa(), newest) == []


def test_patch_adds_the_two_tolerances_and_changes_nothing_else() -> None:
    patch = load_patch(HPA_TOLERANCE_PATCH)
    # A merge patch replaces lists and deletes on null: only two scalar leaves, both 0.
    assert _leaves(patch) == dict.fromkeys(TOLERANCE_PATHS, 0)
    before, after = _leaves(_hpa()), _leaves(_patched_hpa())
    assert {path: after[path] for path in TOLERANCE_PATHS} == dict.fromkeys(TOLERANCE_PATHS, 0)
    assert {path: v for path, v in after.items() if path not in TOLERANCE_PATHS} == before


def test_patch_file_names_the_command_for_the_shipped_hpa() -> None:
    meta = _hpa()["metadata"]
    command = PATCH_COMMAND.format(
        name=meta["name"],
        namespace=meta["namespace"],
        path=HPA_TOLERANCE_PATCH.relative_to(REPO_ROOT).as_posix(),
    )
    comments = [
        line.lstrip("# ").strip()
        for line in HPA_TOLERANCE_PATCH.read_text().splitlines()
        if line.startswith("#")
    ]
    assert command in comments
