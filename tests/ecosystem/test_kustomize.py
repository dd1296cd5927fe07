"""The kustomize packages in config/k8s/: each overlay renders with `kubectl kustomize`, every
rendered document validates (bundled Kubernetes schemas, strict; KEDA and Prometheus Operator CRDs),
and the overlays differ from each other only where they mean to."""

from __future__ import annotations

import copy
from typing import Any

import promql_parser
import pytest

from tests.ecosystem.manifests import (
    K8S_DIR,
    OVERLAYS,
    Manifest,
    all_manifests,
    load_documents,
    manifest_files,
    render,
    schema_errors,
)

RENDERS = {overlay: render(overlay) for overlay in OVERLAYS}

BASE = [
    ("ScaledObject", "llama-8b-vllm"),
    ("TriggerAuthentication", "prometheus-bearer"),
    ("PrometheusRule", "vllm-sizer"),
]
CENTRAL = [
    *BASE,
    ("ConfigMap", "vllm-sizer"),
    ("Deployment", "vllm-sizer"),
    ("Service", "vllm-sizer"),
    ("ServiceMonitor", "vllm-sizer"),
    ("PodMonitor", "llama-8b-vllm"),
]
EXPECTED = {
    "sidecar": [
        *BASE,
        ("ConfigMap", "llama-8b-vllm-sizer"),
        ("Deployment", "llama-8b-vllm"),
        ("Service", "llama-8b-vllm-pods"),
        ("PodMonitor", "llama-8b-vllm"),
    ],
    "central": CENTRAL,
    "central-ha": [
        *[item for item in CENTRAL if item != ("Deployment", "vllm-sizer")],
        ("StatefulSet", "vllm-sizer"),
        ("PodDisruptionBudget", "vllm-sizer"),
    ],
    "scale-to-zero": [*CENTRAL, ("ScaledObject", "qwen-7b-vllm")],
}


def _ident(doc: Manifest) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def _one(overlay: str, kind: str, name: str) -> Manifest:
    (doc,) = [d for d in RENDERS[overlay] if _ident(d) == (kind, name)]
    return doc


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_the_expected_objects(overlay: str) -> None:
    assert sorted(map(_ident, RENDERS[overlay])) == sorted(EXPECTED[overlay])


@pytest.mark.parametrize(
    "doc",
    [doc for overlay in OVERLAYS for doc in RENDERS[overlay]],
    ids=[f"{o}:{'/'.join(_ident(d))}" for o in OVERLAYS for d in RENDERS[o]],
)
def test_every_rendered_object_validates(doc: Manifest) -> None:
    assert schema_errors(doc) == []


def test_a_broken_render_fails_validation() -> None:
    # The render goes through the same strict check: a typo kustomize passes on is caught.
    broken = copy.deepcopy(_one("central-ha", "StatefulSet", "vllm-sizer"))
    broken["spec"]["replica"] = broken["spec"].pop("replicas")
    assert any("'replica' was unexpected" in error for error in schema_errors(broken))


def test_every_manifest_file_is_in_an_overlay_but_the_hpa_alternative() -> None:
    rendered = {_ident(doc) for docs in RENDERS.values() for doc in docs}
    for path in manifest_files():
        if path.name in ("hpa.yaml", "fleet-scaledobjects.yaml"):
            continue  # the HPA alternative, and a fleet's per-variant example: applied by hand
        for doc in load_documents(path):
            assert _ident(doc) in rendered, path.relative_to(K8S_DIR)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlays_render_the_files_unchanged_but_the_ha_patches(overlay: str) -> None:
    for doc in RENDERS[overlay]:
        if overlay == "central-ha" and _ident(doc) == ("ScaledObject", "llama-8b-vllm"):
            continue
        copies = [d for _, d in all_manifests() if _ident(d) == _ident(doc)]
        assert doc in copies, (overlay, _ident(doc))


# --- central-ha: two replicas, a budget, a query that reads one replica -----------------------


def _pod_spec(doc: Manifest) -> dict[str, Any]:
    return copy.deepcopy(doc["spec"]["template"])


def test_ha_runs_two_replicas_and_the_budget_keeps_one() -> None:
    sts = _one("central-ha", "StatefulSet", "vllm-sizer")
    pdb = _one("central-ha", "PodDisruptionBudget", "vllm-sizer")
    assert sts["spec"]["replicas"] == 2
    assert pdb["spec"]["minAvailable"] == 1 < sts["spec"]["replicas"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert (
        sts["spec"]["serviceName"]
        == _one("central-ha", "Service", "vllm-sizer")["metadata"]["name"]
    )


def test_ha_pods_are_the_central_pods_plus_identity_and_spread() -> None:
    ha = _pod_spec(_one("central-ha", "StatefulSet", "vllm-sizer"))
    central = _pod_spec(_one("central", "Deployment", "vllm-sizer"))
    (container,) = ha["spec"]["containers"]
    (env,) = container.pop("env")
    assert env == {
        "name": "VLLM_SIZER_REPLICA",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
    }
    spread = ha["spec"].pop("topologySpreadConstraints")
    assert [c["topologyKey"] for c in spread] == ["kubernetes.io/hostname"]
    # Anything else that drifts between the two copies of the pod would be a silent difference.
    assert ha == central


def _query(overlay: str) -> str:
    (trigger,) = _one(overlay, "ScaledObject", "llama-8b-vllm")["spec"]["triggers"]
    return str(trigger["metadata"]["query"])


def test_ha_query_picks_one_replica_and_other_overlays_keep_the_base_query() -> None:
    base = _query("central")
    assert _query("sidecar") == _query("scale-to-zero") == base
    ha = _query("central-ha")
    assert ha.startswith(base.removesuffix("))") + ")")  # the base query, then one more filter
    expr = promql_parser.parse(ha)
    found: list[str] = []
    promql_parser.walk(
        expr,
        lambda n: found.append(str(n.op)) if isinstance(n, promql_parser.AggregateExpr) else None,
    )
    assert found == ["max", "bottomk"]
    assert "on(sizer_replica) bottomk(1," in ha
