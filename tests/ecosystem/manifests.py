"""Offline schema checks for the Kubernetes manifests in config/k8s/.

Built-in kinds go through `kubernetes-validate` (bundled Kubernetes JSON schemas, strict: unknown
fields fail). KEDA and Prometheus Operator kinds go through the `openAPIV3Schema` of their upstream
CRDs in the shared data folder, with apiVersion/kind pinned and unknown fields rejected the way the
API server's strict field validation does. Files named `*-patch.yaml` are patches, not
manifests (`kubectl patch --type merge`); `merge_patch` applies one the way the API server does.
"""

from __future__ import annotations

import copy
import functools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml

from tests.conftest import REPO_ROOT, shared_path

K8S_DIR = REPO_ROOT / "config" / "k8s"

# The versions every manifest is validated against (strict). hpa.yaml is also checked against every
# version kubernetes-validate bundles (test_k8s_schemas.py): it must apply on <= 1.32 as well.
KUBERNETES_VERSIONS = ("1.34", "1.37")

# The merge patch that adds behavior.*.tolerance to hpa.yaml's HPA where the field exists.
HPA_TOLERANCE_PATCH = K8S_DIR / "hpa-tolerance-patch.yaml"

CRD_FILES = {
    "ScaledObject": "keda.sh_scaledobjects.yaml",
    "TriggerAuthentication": "keda.sh_triggerauthentications.yaml",
    "ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
    "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
    "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
}

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

Manifest = dict[str, Any]


# The kustomize packages: `kubectl kustomize config/k8s/<overlay>` renders each.
OVERLAYS = ("sidecar", "central", "central-ha", "scale-to-zero")
KUSTOMIZATION = "kustomization.yaml"


def _is_patch(path: Path) -> bool:
    return path.name.endswith("-patch.yaml")


def manifest_files() -> list[Path]:
    """Every YAML manifest under config/k8s/ (patch files and kustomizations excluded), sorted."""
    return sorted(
        path
        for path in K8S_DIR.rglob("*.yaml")
        if not _is_patch(path) and path.name != KUSTOMIZATION
    )


def patch_files() -> list[Path]:
    """Every `*-patch.yaml` under config/k8s/, sorted."""
    return sorted(path for path in K8S_DIR.rglob("*.yaml") if _is_patch(path))


def load_patch(path: Path) -> Manifest:
    """The single document of a patch file."""
    (doc,) = load_documents(path)
    return doc


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (`kubectl patch --type merge`), on a copy of `target`."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def bundled_kubernetes_versions() -> list[str]:
    """Every Kubernetes minor version kubernetes-validate has schemas for, oldest first."""
    utils = kubernetes_validate.utils
    return sorted({utils.major_minor(v) for v in utils.all_versions()}, key=_version_key)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def kubernetes_errors(doc: Manifest, version: str) -> list[str]:
    """Strict (unknown fields rejected, like kubectl) violations of a built-in kind on `version`."""
    try:
        validated = kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = "/".join(map(str, exc.path)) or "<root>"
        return [f"k8s {version} {path}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [f"k8s {version}: no schema for {doc.get('kind')}: {exc.message}"]
    if validated != version:  # it falls back to an older schema for a version it lacks
        return [f"k8s {version}: validated against the {validated} schema instead"]
    return []


def render(overlay: str) -> list[Manifest]:
    """The documents `kubectl kustomize config/k8s/<overlay>` renders; a missing kubectl fails."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("`kubectl` is not installed: the kustomize packages cannot be rendered")
    done = subprocess.run(
        [kubectl, "kustomize", str(K8S_DIR / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.load_all(done.stdout, Loader=_Loader) if doc]


def load_documents(path: Path) -> list[Manifest]:
    """The non-empty documents of one multi-document YAML file."""
    with path.open() as fh:
        return [doc for doc in yaml.load_all(fh, Loader=_Loader) if doc]


def all_manifests() -> list[tuple[str, Manifest]]:
    """(id, document) for every document of every file: id = `<file>:<Kind>/<name>`."""
    out = []
    for path in manifest_files():
        for doc in load_documents(path):
            rel = path.relative_to(K8S_DIR).as_posix()
            out.append((f"{rel}:{doc.get('kind')}/{doc.get('metadata', {}).get('name')}", doc))
    return out


def find(kind: str, name: str | None = None, file: str | None = None) -> Manifest:
    """The one manifest of `kind` (and `name`, and relative `file`) under config/k8s/."""
    hits = [
        doc
        for ident, doc in all_manifests()
        if doc.get("kind") == kind
        and (name is None or doc["metadata"]["name"] == name)
        and (file is None or ident.startswith(f"{file}:"))
    ]
    if len(hits) != 1:
        raise LookupError(f"expected one {kind} named {name!r} in {file!r}, found {len(hits)}")
    return hits[0]


def _close(node: Any) -> None:
    """Reject unknown keys wherever the schema declares properties (strict field validation)."""
    if isinstance(node, dict):
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        for value in node.values():
            _close(value)
    elif isinstance(node, list):
        for value in node:
            _close(value)


@functools.cache
def crd_validator(kind: str) -> jsonschema.Draft4Validator:
    """A strict Draft-4 validator for the served+storage version of `kind`'s CRD."""
    with shared_path("data", "schemas", CRD_FILES[kind]).open() as fh:
        crd = yaml.load(fh, Loader=_Loader)
    (version,) = [v for v in crd["spec"]["versions"] if v["served"] and v["storage"]]
    schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
    # `enum`, not `const`: Draft 4 ignores `const`.
    schema["properties"]["apiVersion"] = {"enum": [f"{crd['spec']['group']}/{version['name']}"]}
    schema["properties"]["kind"] = {"enum": [crd["spec"]["names"]["kind"]]}
    schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind"})
    _close(schema)
    return jsonschema.Draft4Validator(schema)


def schema_errors(doc: Manifest) -> list[str]:
    """Every schema violation of one manifest (empty = valid); an unknown kind is an error."""
    kind = doc.get("kind")
    if kind in CRD_FILES:
        return [
            f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in crd_validator(kind).iter_errors(doc)
        ]
    return [error for version in KUBERNETES_VERSIONS for error in kubernetes_errors(doc, version)]
