"""Every shipped PromQL expression also passes Prometheus' own parser (`promtool check rules`).

promql-parser follows an older PromQL grammar; promtool is the parser of the Prometheus server the
integration tests run (Debian's `prometheus` package ships it). Skipped where it is not installed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.ecosystem.dashboard import panel_queries
from tests.ecosystem.manifests import all_manifests, find

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian prometheus) missing")


def shipped_expressions() -> dict[str, str]:
    """Name -> PromQL for every KEDA trigger, every scale_from_zero demand query of the shipped
    configs, the adapter rule and every dashboard query."""
    exprs = {
        _name(f"keda_{doc['metadata']['name']}_{trigger['name']}"): trigger["metadata"]["query"]
        for _, doc in all_manifests()
        if doc["kind"] == "ScaledObject"
        for trigger in doc["spec"]["triggers"]
    }
    for _, doc in all_manifests():
        if doc["kind"] == "ConfigMap" and "config.yaml" in doc["data"]:
            for dep in yaml.safe_load(doc["data"]["config.yaml"]).get("deployments", []):
                if "scale_from_zero" in dep:
                    exprs[_name(f"demand_{dep['name']}")] = dep["scale_from_zero"]["demand_query"]
    adapter = yaml.safe_load(find("ConfigMap", "prometheus-adapter")["data"]["config.yaml"])
    (rule,) = adapter["externalRules"]
    exprs["adapter_series"] = rule["seriesQuery"]
    exprs["adapter_metrics"] = (
        rule["metricsQuery"]
        .replace("<<.Series>>", "vllm_sizer_desired_replicas")
        .replace("<<.LabelMatchers>>", 'namespace="inference",deployment="llama-8b-vllm"')
    )
    for q in panel_queries():
        exprs[f"panel_{q.panel_id}_{q.ref_id}"] = q.expr
    return exprs


def _name(text: str) -> str:
    """A recording rule name part: Kubernetes names have dashes, metric names may not."""
    return text.replace("-", "_")


def promtool_check(exprs: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    rules = {
        "groups": [
            {
                "name": "vllm-sizer-shipped-queries",
                "rules": [{"record": f"check:{name}", "expr": e} for name, e in exprs.items()],
            }
        ]
    }
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_shipped_queries_pass_prometheus_own_parser(tmp_path) -> None:
    exprs = shipped_expressions()
    assert {"keda_qwen_7b_vllm_upstream_demand", "demand_qwen_7b_vllm"} <= set(exprs)
    proc = promtool_check(exprs, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(exprs)} rules found" in proc.stdout


def test_a_broken_query_fails_promtool(tmp_path) -> None:
    broken = {"keda_trigger": 'max(vllm_sizer_desired_replicas{deployment="x"}'}
    proc = promtool_check(broken, tmp_path)
    assert proc.returncode != 0
