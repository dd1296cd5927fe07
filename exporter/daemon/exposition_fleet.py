"""Prometheus families of the fleet plan (exporter/sizing/fleet_cycle.py), from the collector's
snapshot: per model the plan's reason, the rate planned for, its cost per hour and the demand it
leaves unserved; per accelerator type the GPUs available and planned; per variant whether its
calibration is trusted, the capacity per replica the plan counted on and, once its own pods
calibrated it, its transferred prior's capacity error. Each variant's count is its deployment's
`vllm_sizer_desired_replicas`. Families without a fleet are empty."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.daemon.metric_names import PREFIX
from exporter.sizing.fleet.values import PlanReason
from exporter.sizing.fleet_cycle import FleetStatus

MODEL = ("model_name",)
ACCELERATOR = ("accelerator",)
VARIANT = ("deployment", "model_name")


def fleet_families(status: FleetStatus | None) -> Iterator[Metric]:
    """The fleet's families (empty without a plan)."""
    reason = GaugeMetricFamily(
        PREFIX + "fleet_plan_reason",
        "Why the fleet plan's counts for a model are what they are: 1 for the current reason, "
        "0 for the others, as of the last plan.",
        labels=(*MODEL, "reason"),
    )
    demand = GaugeMetricFamily(
        PREFIX + "fleet_demand_requests_per_second",
        "The rate the fleet plan sized a model for (its variants' sizing rates together), "
        "as of the last plan.",
        labels=MODEL,
    )
    cost = GaugeMetricFamily(
        PREFIX + "fleet_cost_per_hour",
        "What a model's desired replicas cost per hour (GPUs times the configured price per "
        "GPU-hour), as of the last plan.",
        labels=MODEL,
    )
    unserved = GaugeMetricFamily(
        PREFIX + "fleet_unserved_requests_per_second",
        "The part of a model's demand the plan cannot carry within its targets (GPUs, "
        "priorities or replicas.max short), as of the last plan.",
        labels=MODEL,
    )
    available = GaugeMetricFamily(
        PREFIX + "fleet_gpus_available",
        "GPUs of an accelerator type the fleet plan may use (the inventory read, at least the "
        "variants' minimums), as of the last plan.",
        labels=ACCELERATOR,
    )
    planned = GaugeMetricFamily(
        PREFIX + "fleet_gpus_planned",
        "GPUs of an accelerator type the fleet's desired replicas take, as of the last plan.",
        labels=ACCELERATOR,
    )
    trusted = GaugeMetricFamily(
        PREFIX + "variant_trusted",
        "1 when a variant's calibration on its own pods is trusted, 0 while the plan counts on "
        "its prior (transferred from a sibling, else physical) less the untrusted margin.",
        labels=VARIANT,
    )
    capacity = GaugeMetricFamily(
        PREFIX + "variant_capacity_requests_per_second",
        "One replica's SLO capacity the fleet plan counted on for a variant, as of the last "
        "plan.",
        labels=VARIANT,
    )
    transfer = GaugeMetricFamily(
        PREFIX + "variant_transfer_capacity_error_ratio",
        "A variant's transferred prior's capacity over its own calibrated capacity, minus 1 "
        "(set once, when its own pods first calibrate it; absent without a transfer).",
        labels=VARIANT,
    )
    plan = None if status is None else status.plan
    if status is not None and plan is not None:
        for model, share in plan.models.items():
            for member in PlanReason:
                reason.add_metric([model, member.value], float(member is share.reason))
            cost.add_metric([model], share.cost_per_hour)
            unserved.add_metric([model], share.unserved_rps)
        for model, rate in status.demand_rps.items():
            demand.add_metric([model], rate)
        for kind, gpus in status.gpus_available.items():
            available.add_metric([kind], float(gpus))
            planned.add_metric([kind], float(plan.gpus_planned.get(kind, 0)))
    if status is not None:
        for name, v in status.variants.items():
            labels = [name, v.model_name]
            trusted.add_metric(labels, float(v.trusted))
            capacity.add_metric(labels, v.capacity_rps)
            if v.transfer_capacity_error is not None:
                transfer.add_metric(labels, v.transfer_capacity_error)
    yield from (reason, demand, cost, unserved, available, planned, trusted, capacity, transfer)
