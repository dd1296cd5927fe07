"""The Grafana dashboard and its provisioning files: structure, queries, coverage."""

from __future__ import annotations

import re

import promql_parser
import pytest
import yaml

from tests.conftest import REPO_ROOT
from tests.ecosystem.dashboard import (
    DEPLOYMENT_COUNTERS,
    DEPLOYMENT_LABELLED,
    EXPORTED_METRICS,
    FLEET_METRICS,
    PER_DEPLOYMENT_METRICS,
    iter_panels,
    load_dashboard,
    panel_queries,
)

DS_REF = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
QUERIES = panel_queries()
SENTINEL = "__the_selected_deployment__"


def selectors(expr: promql_parser.Expr) -> list[promql_parser.VectorSelector]:
    found: list[promql_parser.VectorSelector] = []

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)
        elif isinstance(node, promql_parser.MatrixSelector):
            found.append(node.vector_selector)

    promql_parser.walk(expr, visit)
    return found


def variable(name: str) -> dict:
    (var,) = [v for v in load_dashboard()["templating"]["list"] if v["name"] == name]
    return var


def test_dashboard_carries_schema_version_uid_and_is_read_only() -> None:
    dashboard = load_dashboard()
    assert isinstance(dashboard["schemaVersion"], int) and 36 <= dashboard["schemaVersion"] <= 42
    assert dashboard["uid"] == "vllm-sizer"
    assert dashboard["editable"] is False  # provisioned: edits go to the repository


def test_datasource_variable_and_every_panel_uses_it() -> None:
    ds = variable("DS_PROMETHEUS")
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    for panel in iter_panels(load_dashboard()):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DS_REF, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DS_REF, panel["title"]


def test_deployment_variable_lists_the_deployments_the_sizer_exports() -> None:
    var = variable("deployment")
    assert var["type"] == "query" and var["datasource"] == DS_REF
    match = re.fullmatch(r"label_values\((.+), deployment\)", var["query"]["query"])
    assert match and var["definition"] == var["query"]["query"]
    sel = promql_parser.parse(match.group(1))
    assert isinstance(sel, promql_parser.VectorSelector)
    assert sel.name in PER_DEPLOYMENT_METRICS


def test_panel_ids_are_unique_and_panels_do_not_overlap() -> None:
    panels = iter_panels(load_dashboard())
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, panel["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: f"{q.panel_id}{q.ref_id}-{q.panel_title}")
def test_panel_query_parses_as_promql(query) -> None:
    assert "$" not in query.expr, "a template variable was left unsubstituted"
    promql_parser.parse(query.expr)  # raises ValueError on bad PromQL


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: f"{q.panel_id}{q.ref_id}-{q.panel_title}")
def test_panel_query_reads_only_exported_metrics_filtered_by_the_variable(query) -> None:
    expr = promql_parser.parse(
        query.raw.replace("$deployment", SENTINEL).replace("$__rate_interval", "1m")
    )
    sels = selectors(expr)
    assert sels, "a panel query reads no series"
    for sel in sels:
        assert sel.name in EXPORTED_METRICS, f"unknown metric {sel.name}"
        labels = {m.name: m.value for m in sel.matchers.matchers}
        if sel.name in DEPLOYMENT_LABELLED:
            assert labels.get("deployment") == SENTINEL, f"{sel.name} not filtered by $deployment"


def test_every_exported_metric_has_a_panel() -> None:
    used = {sel.name for q in QUERIES for sel in selectors(promql_parser.parse(q.expr))}
    assert EXPORTED_METRICS - used == set()


def test_latency_panels_draw_the_slo_line() -> None:
    for key in ("ttft", "itl"):
        (panel,) = [p for p in iter_panels(load_dashboard()) if p["title"].startswith(key.upper())]
        exprs = " ".join(t["expr"] for t in panel["targets"])
        for kind in ("observed", "predicted", "slo"):
            assert f"vllm_sizer_{kind}_{key}_seconds" in exprs
        assert panel["fieldConfig"]["defaults"]["unit"] == "s"


def test_capacity_is_max_rate_per_replica_times_replicas() -> None:
    (panel,) = [p for p in iter_panels(load_dashboard()) if p["title"].startswith("Arrival rate")]
    exprs = [promql_parser.parse(t["expr"].replace("$deployment", "d")) for t in panel["targets"]]
    products = [
        e
        for e in exprs
        if isinstance(e, promql_parser.BinaryExpr)
        and {s.name for s in selectors(e)}
        == {"vllm_sizer_max_rate_per_replica_requests_per_second", "vllm_sizer_current_replicas"}
    ]
    assert products and str(products[0].op) == "*"


def test_provisioning_loads_the_dashboard_from_a_file_provider() -> None:
    prov = REPO_ROOT / "grafana" / "provisioning"
    datasources = yaml.safe_load((prov / "datasources" / "prometheus.yaml").read_text())
    assert datasources["apiVersion"] == 1
    (ds,) = datasources["datasources"]
    assert ds["type"] == "prometheus" and ds["url"].startswith("http")
    dashboards = yaml.safe_load((prov / "dashboards" / "vllm-sizer.yaml").read_text())
    assert dashboards["apiVersion"] == 1
    (provider,) = dashboards["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")


def test_a_broken_query_or_unknown_metric_fails_the_same_checks() -> None:
    dashboard = load_dashboard()
    panel = next(p for p in iter_panels(dashboard) if p["type"] != "row")
    panel["targets"][0]["expr"] = 'max(vllm_sizer_desired_replicas{deployment="$deployment"}'
    (broken, *_) = panel_queries(dashboard)
    with pytest.raises(ValueError, match="unclosed left parenthesis"):
        promql_parser.parse(broken.expr)
    panel["targets"][0]["expr"] = 'max(vllm_sizer_desird_replicas{deployment="$deployment"})'
    (typo, *_) = panel_queries(dashboard)
    assert {s.name for s in selectors(promql_parser.parse(typo.expr))} - EXPORTED_METRICS


def test_known_metric_list_matches_what_the_collector_exports() -> None:
    import exporter.daemon.exposition as collector
    import exporter.daemon.exposition_fleet as exposition_fleet

    gauges = {collector.PREFIX + spec.name for spec in collector.GAUGES}
    enums = {collector.PREFIX + spec.name for spec in collector.ENUM_GAUGES}
    families = list(collector.SnapshotCollector().describe())
    names = {m.name for m in families}
    percentiles = {collector.PREFIX + name for name in collector.PERCENTILE_GAUGES}
    labelled = {
        collector.PREFIX + name
        for name in (
            "fit_error_ratio",
            "demand",
            "request_length_cv",
            "parameter_source",
            "predicted_slo_attainment_ratio",
            "observed_slo_attainment_ratio",
            "observed_slo_window_requests",
            "slo_target_feasible",
        )
    }
    fleet = {m.name for m in exposition_fleet.fleet_families(None)}
    assert gauges | enums | percentiles | labelled | fleet == names
    assert {m.type for m in families} == {"gauge"}
    drifted = "dashboard list drifted from the daemon"
    assert set(PER_DEPLOYMENT_METRICS) | FLEET_METRICS == names, drifted


def test_enum_gauges_are_state_timelines_of_the_current_value() -> None:
    import exporter.daemon.exposition as collector

    timelines = [p for p in iter_panels(load_dashboard()) if p["type"] == "state-timeline"]
    for spec in collector.ENUM_GAUGES:
        name = collector.PREFIX + spec.name
        (panel,) = [p for p in timelines if name in p["targets"][0]["expr"]]
        (target,) = panel["targets"]
        expr = promql_parser.parse(target["expr"].replace("$deployment", "d"))
        # One row per value, drawn only while it is the current one (the others are 0).
        assert isinstance(expr, promql_parser.BinaryExpr) and str(expr.op) == "=="
        assert isinstance(expr.rhs, promql_parser.NumberLiteral) and expr.rhs.val == 1
        assert isinstance(expr.lhs, promql_parser.AggregateExpr)
        assert list(expr.lhs.modifier.labels) == [spec.label]
        assert target["legendFormat"] == "{{" + spec.label + "}}"


def test_every_dashboard_metric_is_registered_by_the_daemon() -> None:
    from prometheus_client import CollectorRegistry

    import exporter.collector.from_config as sources_from_config
    import exporter.daemon.daemon as daemon
    from exporter.base.clock import ManualClock
    from exporter.config.loader import parse_config
    from exporter.daemon.exposition import BuildInfoCollector
    from exporter.daemon.operation_metrics import QueryMetrics
    from exporter.daemon.replica_label import register_start

    dep = {
        "name": "llama",
        "model_name": "llama-3",
        "source": {"scrape_urls": ["http://127.0.0.1:1/metrics"]},
        "slo": {"ttft_ms": 500, "itl_ms": 50},
    }
    config = parse_config({"deployments": [dep]})
    clock = ManualClock(0.0)
    registry = CollectorRegistry()
    daemon.Daemon(config, sources_from_config.build_sources(config, clock), registry, clock)
    registry.register(BuildInfoCollector("0.0.0"))
    QueryMetrics(registry)  # registered by `run` beside the daemon's own
    register_start(registry, 0.0)
    suffixes = {
        "counter": ("_total",),
        "info": ("_info",),
        "histogram": ("_bucket", "_sum", "_count"),
    }
    families = list(registry.collect())
    names = {f.name + s for f in families for s in suffixes.get(f.type, ("",))}
    assert names == EXPORTED_METRICS, "dashboard list drifted from the daemon's registry"
    # The error counters exist per deployment from the start (at 0), so rate() sees the first.
    labelled = {
        s.name
        for f in families
        for s in f.samples
        if s.labels.get("deployment") == "llama" and not s.name.endswith("_created")
    }
    assert labelled == DEPLOYMENT_COUNTERS
