"""The Grafana dashboard's queries, with template variables substituted, and the exported names."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tests.conftest import REPO_ROOT

DASHBOARD_PATH = REPO_ROOT / "grafana" / "vllm-sizer.json"

# Every series the daemon exports. The per-deployment ones come from the snapshot collector
# (labels `deployment`, `model_name`, plus `reason`/`state` on the enum-style gauges, `signal`
# on the fit error and `kind` on the demand); the health metrics are the daemon's own, per
# process, and only the error counters among them carry a `deployment` label.
PER_DEPLOYMENT_METRICS = frozenset(
    {
        "vllm_sizer_desired_replicas",
        "vllm_sizer_current_replicas",
        "vllm_sizer_predicted_ttft_seconds",
        "vllm_sizer_predicted_itl_seconds",
        "vllm_sizer_observed_ttft_seconds",
        "vllm_sizer_observed_itl_seconds",
        "vllm_sizer_arrival_rate_requests_per_second",
        "vllm_sizer_max_rate_per_replica_requests_per_second",
        "vllm_sizer_saturation_rate_per_replica_requests_per_second",
        "vllm_sizer_model_alpha_seconds",
        "vllm_sizer_model_beta_seconds",
        "vllm_sizer_model_gamma_seconds",
        "vllm_sizer_slo_ttft_seconds",
        "vllm_sizer_slo_itl_seconds",
        "vllm_sizer_saturated",
        "vllm_sizer_slo_headroom_ratio",
        "vllm_sizer_source_up",
        "vllm_sizer_pods_observed",
        "vllm_sizer_recommendation_reason",
        "vllm_sizer_tuner_state",
        "vllm_sizer_tuner_reason",
        "vllm_sizer_fit_error_ratio",
        "vllm_sizer_binding_target",
        "vllm_sizer_headroom_factor",
        "vllm_sizer_headroom_reason",
        "vllm_sizer_slo_target_feasible",
        "vllm_sizer_predicted_ttft_quantile_seconds",
        "vllm_sizer_predicted_itl_quantile_seconds",
        "vllm_sizer_slo_ttft_quantile_seconds",
        "vllm_sizer_slo_itl_quantile_seconds",
        "vllm_sizer_predicted_slo_attainment_ratio",
        "vllm_sizer_observed_slo_attainment_ratio",
        "vllm_sizer_observed_slo_window_requests",
        "vllm_sizer_demand",
        "vllm_sizer_request_length_cv",
        "vllm_sizer_prefix_cache_hit_ratio",
        "vllm_sizer_arrival_cv",
        "vllm_sizer_kv_batch_limit",
        "vllm_sizer_calibration_confidence",
        "vllm_sizer_extrapolation_ratio",
        "vllm_sizer_capacity_extrapolated",
        "vllm_sizer_prompt_burst_factor",
        "vllm_sizer_parameter_source",
        "vllm_sizer_forecaster",
        "vllm_sizer_forecast_horizon_seconds",
        "vllm_sizer_forecast_error_ratio",
        # A fleet variant's (exporter/daemon/exposition_fleet.py): per deployment, too.
        "vllm_sizer_variant_trusted",
        "vllm_sizer_variant_capacity_requests_per_second",
        "vllm_sizer_variant_transfer_capacity_error_ratio",
    }
)
# The fleet plan's, per model (`model_name`) or accelerator type (`accelerator`).
FLEET_METRICS = frozenset(
    {
        "vllm_sizer_fleet_plan_reason",
        "vllm_sizer_fleet_demand_requests_per_second",
        "vllm_sizer_fleet_cost_per_hour",
        "vllm_sizer_fleet_unserved_requests_per_second",
        "vllm_sizer_fleet_gpus_available",
        "vllm_sizer_fleet_gpus_planned",
    }
)
# Per-deployment counters of the daemon (label `deployment`, but no `model_name`).
DEPLOYMENT_COUNTERS = frozenset(
    {
        "vllm_sizer_scrape_errors_total",
        "vllm_sizer_observation_problems_total",
    }
)
HEALTH_METRICS = DEPLOYMENT_COUNTERS | frozenset(
    {
        "vllm_sizer_cycle_duration_seconds",
        "vllm_sizer_cycle_seconds_bucket",
        "vllm_sizer_cycle_seconds_sum",
        "vllm_sizer_cycle_seconds_count",
        "vllm_sizer_prometheus_query_seconds_bucket",
        "vllm_sizer_prometheus_query_seconds_sum",
        "vllm_sizer_prometheus_query_seconds_count",
        "vllm_sizer_last_successful_cycle_timestamp_seconds",
        "vllm_sizer_cycles_total",
        "vllm_sizer_cycles_skipped_total",
        "vllm_sizer_state_save_errors_total",
        "vllm_sizer_build_info",
        "vllm_sizer_started_timestamp_seconds",
        "vllm_sizer_inventory_read_errors_total",
    }
)
# Every series that a panel must filter by deployment="$deployment".
DEPLOYMENT_LABELLED = PER_DEPLOYMENT_METRICS | DEPLOYMENT_COUNTERS
EXPORTED_METRICS = PER_DEPLOYMENT_METRICS | FLEET_METRICS | HEALTH_METRICS

# Values Grafana would put in place of the template variables (built-ins and the dashboard's own).
VARIABLE_VALUES = {
    "${DS_PROMETHEUS}": "prometheus",
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "3h",
    "$deployment": "llama-8b-vllm",
}


@dataclass(frozen=True, slots=True)
class PanelQuery:
    """One target of one panel: where it is and its PromQL before and after substitution."""

    panel_id: int
    panel_title: str
    ref_id: str
    raw: str
    expr: str


def load_dashboard() -> dict[str, Any]:
    with DASHBOARD_PATH.open() as fh:
        return json.load(fh)


def iter_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, including the ones nested in collapsed rows."""
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def substitute(text: str, values: dict[str, str] | None = None) -> str:
    """Replace template variables the way Grafana does (longest names first)."""
    values = VARIABLE_VALUES if values is None else values
    for name in sorted(values, key=len, reverse=True):
        text = text.replace(name, values[name])
    return text


def panel_queries(
    dashboard: dict[str, Any] | None = None, values: dict[str, str] | None = None
) -> list[PanelQuery]:
    """Every PromQL target of every panel, substituted."""
    dashboard = load_dashboard() if dashboard is None else dashboard
    return [
        PanelQuery(
            panel["id"], panel["title"], t["refId"], t["expr"], substitute(t["expr"], values)
        )
        for panel in iter_panels(dashboard)
        for t in panel.get("targets", [])
    ]
