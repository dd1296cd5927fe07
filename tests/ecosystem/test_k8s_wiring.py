"""What the schemas cannot check: the manifests agree with each other and scale on the right rule.

KEDA and the HPA must land exactly on the sizer's recommendation (AverageValue, target 1, no
tolerance, no stacked windows), a missing metric must never read as 0, sidecar copies must be
folded with max (never summed), and every selector, port name and name reference must resolve.
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlsplit

import promql_parser
import pytest
import yaml

from tests.ecosystem.manifests import (
    HPA_TOLERANCE_PATCH,
    K8S_DIR,
    Manifest,
    find,
    load_patch,
    merge_patch,
)

SIZER_PORT = 9464
SCALED = "llama-8b-vllm"
DESIRED = "vllm_sizer_desired_replicas"


def scaled_object() -> Manifest:
    return find("ScaledObject", SCALED)


def trigger() -> dict[str, Any]:
    (trig,) = scaled_object()["spec"]["triggers"]
    return trig


def hpa() -> Manifest:
    return find("HorizontalPodAutoscaler", SCALED)


def patched_hpa() -> Manifest:
    """hpa.yaml's HPA after `kubectl patch --type merge` with hpa-tolerance-patch.yaml."""
    return merge_patch(hpa(), load_patch(HPA_TOLERANCE_PATCH))


def vllm_deployment() -> Manifest:
    return find("Deployment", SCALED, file="sidecar/deployment.yaml")


def sizer_configs() -> dict[str, dict[str, Any]]:
    """Mode -> the parsed config.yaml of that mode's ConfigMap."""
    return {
        mode: yaml.safe_load(
            find("ConfigMap", file=f"{mode}/configmap.yaml")["data"]["config.yaml"]
        )
        for mode in ("sidecar", "central")
    }


def containers(deployment: Manifest) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def port_names(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def selectors(expr: promql_parser.Expr) -> list[promql_parser.VectorSelector]:
    found: list[promql_parser.VectorSelector] = []
    promql_parser.walk(
        expr, lambda n: found.append(n) if isinstance(n, promql_parser.VectorSelector) else None
    )
    return found


def aggregations(expr: promql_parser.Expr) -> list[str]:
    ops: list[str] = []
    promql_parser.walk(
        expr,
        lambda n: ops.append(str(n.op)) if isinstance(n, promql_parser.AggregateExpr) else None,
    )
    return ops


def matchers(sel: promql_parser.VectorSelector) -> dict[str, str]:
    return {m.name: m.value for m in sel.matchers.matchers}


def hpa_replicas(metric: float, target: float, current: int, metric_type: str) -> int:
    """The HPA's external-metric rule (replica_calculator.go), tolerance 0."""
    if metric_type == "AverageValue":
        return math.ceil(metric / target)
    if metric_type == "Value":
        return math.ceil(metric / target * current)
    raise ValueError(f"`metric_type` must be AverageValue or Value, got {metric_type!r}")


# --- KEDA ----------------------------------------------------------------------------------------


def test_scaled_object_targets_the_vllm_deployment() -> None:
    ref = scaled_object()["spec"]["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == ("apps/v1", "Deployment", SCALED)
    assert vllm_deployment()["metadata"]["namespace"] == scaled_object()["metadata"]["namespace"]


def test_trigger_lands_exactly_on_the_recommendation() -> None:
    trig = trigger()
    meta = trig["metadata"]
    assert trig["type"] == "prometheus"
    assert trig["metricType"] == "AverageValue"
    assert meta["threshold"] == "1"
    assert meta["activationThreshold"] == "0"
    # A vanished gauge must be an error (-> fallback), not a 0 that scales to minReplicaCount.
    assert meta["ignoreNullValues"] == "false"
    assert {"serverAddress", "query", "threshold"} <= set(meta)


@pytest.mark.parametrize("current", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("desired", [1, 2, 4, 7])
def test_average_value_gives_the_desired_count_whatever_the_current(current, desired) -> None:
    threshold = float(trigger()["metadata"]["threshold"])
    metric_type = trigger()["metricType"]
    assert hpa_replicas(desired, threshold, current, metric_type) == desired
    if current > 1:  # Value would multiply by the current count: the runaway this wiring avoids
        assert hpa_replicas(desired, threshold, current, "Value") == desired * current


def test_trigger_query_is_max_of_the_desired_gauge_for_this_deployment() -> None:
    # The whole query is the max of the sizer's gauge: its hand-over count included, no
    # arithmetic of its own.
    expr = promql_parser.parse(trigger()["metadata"]["query"])
    assert isinstance(expr, promql_parser.AggregateExpr) and str(expr.op) == "max"
    # Sidecar mode has one copy per pod: summing them would multiply the recommendation.
    assert "sum" not in aggregations(expr)
    desired = [s for s in selectors(expr) if s.name == DESIRED]
    assert len(desired) == 1
    assert matchers(desired[0]) == {
        "namespace": scaled_object()["metadata"]["namespace"],
        "deployment": scaled_object()["spec"]["scaleTargetRef"]["name"],
    }
    # Freshness guard: a sizer without a recent successful cycle contributes nothing.
    names = {s.name for s in selectors(expr)}
    assert "vllm_sizer_last_successful_cycle_timestamp_seconds" in names


def test_fallback_holds_the_current_count_on_outage() -> None:
    spec = scaled_object()["spec"]
    fallback = spec["fallback"]
    assert fallback["behavior"] == "currentReplicasIfHigher"
    assert fallback["failureThreshold"] >= 1
    assert spec["minReplicaCount"] <= fallback["replicas"] <= spec["maxReplicaCount"]
    # The CRD's CEL rule (min <= max) is only evaluated by the API server.
    assert spec["minReplicaCount"] <= spec["maxReplicaCount"]


@pytest.mark.parametrize("which", ["keda", "hpa"])
def test_behavior_has_no_dead_band_and_no_stacked_windows(which) -> None:
    # The HPA's tolerance ships in a patch (Kubernetes <= 1.32 rejects the field): check the result.
    behavior = (
        scaled_object()["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        if which == "keda"
        else patched_hpa()["spec"]["behavior"]
    )
    for direction in ("scaleUp", "scaleDown"):
        rules = behavior[direction]
        assert float(rules["tolerance"]) == 0, direction
        # The sizer already stabilizes scale-down over its own window; a second would stack.
        assert rules["stabilizationWindowSeconds"] == 0, direction
    # A scale-up policy must allow reaching maxReplicas from minReplicas in one period.
    spec = scaled_object()["spec"] if which == "keda" else hpa()["spec"]
    top = spec.get("maxReplicaCount", spec.get("maxReplicas"))
    pods_steps = [p["value"] for p in behavior["scaleUp"]["policies"] if p["type"] == "Pods"]
    assert max(pods_steps) >= top - 1


def test_trigger_authentication_supplies_the_bearer_token() -> None:
    trig = trigger()
    assert trig["metadata"]["authModes"] == "bearer"
    ref = trig["authenticationRef"]
    auth = find(ref.get("kind", "TriggerAuthentication"), ref["name"])
    assert auth["metadata"]["namespace"] == scaled_object()["metadata"]["namespace"]
    params = {entry["parameter"] for entry in auth["spec"]["secretTargetRef"]}
    assert params == {"bearerToken"}


# --- HPA + prometheus-adapter --------------------------------------------------------------------


def adapter_rule() -> dict[str, Any]:
    config = yaml.safe_load(find("ConfigMap", "prometheus-adapter")["data"]["config.yaml"])
    (rule,) = config["externalRules"]
    return rule


def render_adapter_template(template: str, series: str, label_matchers: str) -> str:
    """prometheus-adapter's Go-template placeholders, filled the way the adapter fills them."""
    return (
        template.replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", label_matchers)
        .replace("<<.GroupBy>>", "deployment")
    )


def test_hpa_uses_the_external_gauge_with_average_value_1() -> None:
    spec = hpa()["spec"]
    assert spec["scaleTargetRef"]["name"] == SCALED
    (metric,) = spec["metrics"]  # the HPA takes the max over metrics: one only
    assert metric["type"] == "External"
    ext = metric["external"]
    assert ext["metric"]["name"] == DESIRED
    assert ext["metric"]["selector"]["matchLabels"] == {"deployment": SCALED}
    assert ext["target"] == {"type": "AverageValue", "averageValue": "1"}


def test_adapter_rule_serves_the_hpa_metric_and_folds_copies_with_max() -> None:
    rule = adapter_rule()
    assert rule["name"]["as"] == hpa()["spec"]["metrics"][0]["external"]["metric"]["name"]
    assert rule["resources"]["overrides"]["namespace"] == {"resource": "namespace"}
    series = promql_parser.parse(rule["seriesQuery"])
    assert isinstance(series, promql_parser.VectorSelector) and series.name == DESIRED
    query = render_adapter_template(
        rule["metricsQuery"], DESIRED, f'namespace="inference",deployment="{SCALED}"'
    )
    expr = promql_parser.parse(query)
    # The HPA sums every series it gets; one per deployment, folded with max.
    assert isinstance(expr, promql_parser.AggregateExpr) and str(expr.op) == "max"
    assert list(expr.modifier.labels) == ["deployment"]
    assert "sum" not in aggregations(expr)
    (desired,) = [s for s in selectors(expr) if s.name == DESIRED]
    assert matchers(desired)["deployment"] == SCALED


def test_keda_hpa_and_sizer_configs_clamp_to_the_same_bounds() -> None:
    keda_spec, hpa_spec = scaled_object()["spec"], hpa()["spec"]
    bounds = {
        "keda": (keda_spec["minReplicaCount"], keda_spec["maxReplicaCount"]),
        "hpa": (hpa_spec["minReplicas"], hpa_spec["maxReplicas"]),
    }
    for mode, config in sizer_configs().items():
        (dep,) = [d for d in config["deployments"] if d["name"] == SCALED]
        bounds[mode] = (dep["replicas"]["min"], dep["replicas"]["max"])
    assert len(set(bounds.values())) == 1, bounds


# --- the sizer's own manifests -------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sidecar", "central"])
def test_sizer_config_names_the_scaled_deployment_and_its_model(mode) -> None:
    config = sizer_configs()[mode]
    (dep,) = [d for d in config["deployments"] if d["name"] == SCALED]
    vllm_args = containers(vllm_deployment())["vllm"]["args"]
    assert f"--model={dep['model_name']}" in vllm_args
    # The sizer's server settings must mirror vLLM's scheduler flags (vLLM does not export them).
    assert f"--max-num-seqs={dep['server']['max_num_seqs']}" in vllm_args
    assert f"--max-num-batched-tokens={dep['server']['max_num_batched_tokens']}" in vllm_args
    assert config["listen_address"].endswith(f":{SIZER_PORT}")


@pytest.mark.parametrize(
    ("file", "name", "container", "port"),
    [
        ("sidecar/deployment.yaml", SCALED, "vllm-sizer", "sizer-metrics"),
        ("central/deployment.yaml", "vllm-sizer", "vllm-sizer", "metrics"),
    ],
)
def test_sizer_container_mounts_its_config_and_probes_its_port(file, name, container, port) -> None:
    deployment = find("Deployment", name, file=file)
    pod = deployment["spec"]["template"]["spec"]
    sizer = containers(deployment)[container]
    assert port_names(sizer) == {port: SIZER_PORT}
    assert sizer["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
    assert sizer["securityContext"]["runAsNonRoot"] is True
    assert sizer["args"] == ["--config=/etc/vllm-sizer/config.yaml"]
    mounts = {m["mountPath"]: m["name"] for m in sizer["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_map = volumes[mounts["/etc/vllm-sizer"]]["configMap"]["name"]
    assert find("ConfigMap", config_map, file=file.replace("deployment.yaml", "configmap.yaml"))
    # The state file lives on a writable volume (the root filesystem is read-only).
    state_file = yaml.safe_load(find("ConfigMap", config_map)["data"]["config.yaml"])["state_file"]
    assert any(state_file.startswith(path + "/") for path in mounts)


def test_sidecar_never_gates_vllm_traffic_and_autoscaler_owns_the_count() -> None:
    deployment = vllm_deployment()
    # A sizer readiness probe would pull vLLM out of its Service whenever a metric is missing.
    assert "readinessProbe" not in containers(deployment)["vllm-sizer"]
    # `kubectl apply` of a fixed replica count would fight KEDA/HPA.
    assert "replicas" not in deployment["spec"]


def test_central_sizer_is_ready_only_after_a_cycle() -> None:
    sizer = containers(find("Deployment", "vllm-sizer"))["vllm-sizer"]
    assert sizer["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert find("Deployment", "vllm-sizer")["spec"]["replicas"] == 1


@pytest.mark.parametrize(
    ("monitor_file", "kind", "target_file", "target_name", "container"),
    [
        ("sidecar/podmonitor.yaml", "PodMonitor", "sidecar/deployment.yaml", SCALED, None),
        ("central/vllm-podmonitor.yaml", "PodMonitor", "sidecar/deployment.yaml", SCALED, "vllm"),
    ],
)
def test_pod_monitors_select_existing_pods_and_ports(
    monitor_file, kind, target_file, target_name, container
) -> None:
    monitor = find(kind, file=monitor_file)
    deployment = find("Deployment", target_name, file=target_file)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert monitor["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    ports = {
        name
        for cname, c in containers(deployment).items()
        if container is None or cname == container
        for name in port_names(c)
    }
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        assert endpoint["port"] in ports


def test_service_monitor_reaches_the_central_sizer_through_its_service() -> None:
    monitor, service = find("ServiceMonitor", "vllm-sizer"), find("Service", "vllm-sizer")
    deployment = find("Deployment", "vllm-sizer")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    target_port = service_ports[endpoint["port"]]["targetPort"]
    assert target_port in port_names(containers(deployment)["vllm-sizer"])
    assert service_ports[endpoint["port"]]["port"] == SIZER_PORT


def test_sidecars_read_every_vllm_pod_through_the_headless_service() -> None:
    (dep,) = [d for d in sizer_configs()["sidecar"]["deployments"] if d["name"] == SCALED]
    url = urlsplit(dep["source"]["scrape_service"])
    service_name, namespace, *_ = url.hostname.split(".")
    service = find("Service", service_name, file="sidecar/service-headless.yaml")
    assert service["metadata"]["namespace"] == namespace
    # Headless: DNS answers with every ready pod, so each sidecar sees the whole deployment's load.
    assert service["spec"]["clusterIP"] == "None"
    deployment = vllm_deployment()
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == url.port]
    assert port_names(containers(deployment)["vllm"])[port["targetPort"]] == url.port
    assert url.path == "/metrics"


@pytest.mark.parametrize("mode", ["sidecar", "central"])
def test_sizer_configmap_is_accepted_by_the_daemon_config_loader(mode) -> None:
    import exporter.config.loader as config_module

    config = config_module.parse_config(sizer_configs()[mode])  # ConfigError lists every bad key
    (dep,) = [d for d in config.deployments if d.name == SCALED]
    assert config.listen_port == SIZER_PORT
    assert (dep.min_replicas, dep.max_replicas) == (
        scaled_object()["spec"]["minReplicaCount"],
        scaled_object()["spec"]["maxReplicaCount"],
    )
    assert dep.source.kind == ("scrape" if mode == "sidecar" else "prometheus")


# --- scale to zero (central mode) --------------------------------------------------------------

ZERO = "qwen-7b-vllm"
ZERO_FILE = "scale-to-zero/keda-scaledobject-scale-to-zero.yaml"


def zero_object() -> Manifest:
    return find("ScaledObject", ZERO, file=ZERO_FILE)


def zero_triggers() -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in zero_object()["spec"]["triggers"]}


def zero_config() -> dict[str, Any]:
    (dep,) = [d for d in sizer_configs()["central"]["deployments"] if d["name"] == ZERO]
    return dep


def keda_active(value: float, activation_threshold: float) -> bool:
    """KEDA's activation rule (0 <-> 1): a trigger is active when its value is above it."""
    return value > activation_threshold


def test_zero_object_scales_a_central_deployment_with_scale_from_zero() -> None:
    spec, dep = zero_object()["spec"], zero_config()
    assert spec["scaleTargetRef"]["name"] == ZERO and spec["minReplicaCount"] == 0
    assert (dep["replicas"]["min"], dep["replicas"]["max"]) == (0, spec["maxReplicaCount"])
    assert "prometheus_selector" in dep["source"]  # central mode: a sidecar has no pod at zero
    # Failing triggers are inactive: the cooldown is how long a Prometheus outage is ridden out
    # while serving before KEDA scales to 0, so it must outlast the fallback's failures.
    fallback_s = spec["fallback"]["failureThreshold"] * spec["pollingInterval"]
    assert spec["cooldownPeriod"] >= 2 * fallback_s
    # The daemon's loader accepts the zero deployment of the ConfigMap.
    import exporter.config.loader as config_module

    config = config_module.parse_config(sizer_configs()["central"])
    (parsed,) = [d for d in config.deployments if d.name == ZERO]
    assert parsed.min_replicas == 0 and parsed.scale_from_zero is not None


def test_zero_object_has_the_sizer_trigger_and_a_demand_activation() -> None:
    triggers = zero_triggers()
    assert set(triggers) == {"vllm-sizer-desired-replicas", "upstream-demand"}
    sizer, demand = triggers["vllm-sizer-desired-replicas"], triggers["upstream-demand"]
    for trig in (sizer, demand):
        assert trig["type"] == "prometheus" and trig["metricType"] == "AverageValue"
        assert trig["metadata"]["activationThreshold"] == "0"
        assert trig["metadata"]["ignoreNullValues"] == "false"  # empty = error, never 0
        assert find(trig["authenticationRef"]["kind"], trig["authenticationRef"]["name"])
    # KEDA reads the very demand the sizer reads.
    assert demand["metadata"]["query"] == zero_config()["scale_from_zero"]["demand_query"]
    # The sizer trigger is the main file's, for this deployment.
    expr = promql_parser.parse(sizer["metadata"]["query"])
    assert isinstance(expr, promql_parser.AggregateExpr) and str(expr.op) == "max"
    (desired,) = [s for s in selectors(expr) if s.name == DESIRED]
    assert matchers(desired) == {"namespace": "inference", "deployment": ZERO}
    assert sizer["metadata"]["threshold"] == "1"


@pytest.mark.parametrize(
    ("desired", "demand", "active"),
    [
        (0, 0.0, False),  # the sizer says 0 and nothing comes: KEDA scales to 0 (after cooldown)
        (0, 0.02, True),  # the first request: KEDA wakes the Deployment before the sizer's cycle
        (2, 0.0, True),  # the sizer still wants replicas (idle_s not over): no scale to 0
        (3, 40.0, True),
    ],
)
def test_activation_is_zero_only_when_the_sizer_says_zero_and_no_demand_comes(
    desired: int, demand: float, active: bool
) -> None:
    triggers = zero_triggers()
    values = {"vllm-sizer-desired-replicas": desired, "upstream-demand": demand}
    assert any(
        keda_active(values[name], float(t["metadata"]["activationThreshold"]))
        for name, t in triggers.items()
    ) is active


@pytest.mark.parametrize("desired", [1, 2, 4])
@pytest.mark.parametrize("demand", [0.0, 0.5, 37.0, 5000.0])
def test_while_serving_the_count_is_the_sizers_whatever_the_demand(desired, demand) -> None:
    # The HPA takes the highest count over the triggers' metrics: the demand trigger asks for
    # one replica at most, so the sizer's count stands.
    triggers = zero_triggers()
    values = {"vllm-sizer-desired-replicas": desired, "upstream-demand": demand}
    counts = [
        hpa_replicas(values[name], float(t["metadata"]["threshold"]), 1, t["metricType"])
        for name, t in triggers.items()
    ]
    assert max(counts) == desired


def test_zero_object_fallback_never_scales_in_and_names_its_limits() -> None:
    spec = zero_object()["spec"]
    fallback = spec["fallback"]
    assert fallback["behavior"] == "currentReplicasIfHigher"
    assert 1 <= fallback["replicas"] <= spec["maxReplicaCount"]
    # The file says where the fallback does not act (at 0 the HPA does nothing).
    assert "only while serving" in (K8S_DIR / ZERO_FILE).read_text()
