"""Why a recommendation is what it is: the exported reason values and their messages."""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    """Why the desired replica count is what it is; values are exported label values."""

    AT_TARGET = "at_target"
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    STABILIZING = "scale_down_stabilizing"
    QUEUE_GROWING = "queue_growing"
    MAX_REPLICAS = "max_replicas"
    SLO_INFEASIBLE = "slo_infeasible"
    TUNER_WARMING = "tuner_warming"
    NO_WORKLOAD = "no_workload_yet"
    FIRST_WINDOW = "first_window"
    SOURCE_DOWN = "source_down"
    NO_PODS = "no_pods"
    MODEL_NOT_FOUND = "model_not_found"
    PODS_UNOBSERVED = "pods_unobserved"
    IDLE = "idle"
    SCALED_TO_ZERO = "scaled_to_zero"
    DEMAND_FROM_ZERO = "demand_from_zero"
    DEMAND_UNKNOWN = "demand_unknown"
    TAIL_SHORTFALL = "slo_tail_shortfall"
    HANDOVER = "handover"
    EVIDENCE_BOUND = "evidence_bound"
    FLEET_PLAN = "fleet_plan"


REASON_MESSAGES: dict[Reason, str] = {
    Reason.TAIL_SHORTFALL: "observed attainment of a percentile target fell short of the "
    "model's: sized with that target tightened by the shortfall",
    Reason.EVIDENCE_BOUND: "the recent windows bound the model's capacity: sized at their edge",
    Reason.AT_TARGET: "the current replicas meet the targets at the observed load",
    Reason.SCALE_UP: "more replicas are needed to meet the targets at the observed load",
    Reason.SCALE_DOWN: "fewer replicas meet the targets at the observed load",
    Reason.STABILIZING: "fewer replicas would do, held by the scale-down stabilization window",
    Reason.QUEUE_GROWING: "requests queue up faster than they complete: one replica more",
    Reason.MAX_REPLICAS: "the targets need more replicas than replicas.max allows",
    Reason.SLO_INFEASIBLE: "the targets cannot be met at any load: recommending replicas.max",
    Reason.TUNER_WARMING: "no model parameters yet: holding the current replica count",
    Reason.NO_WORKLOAD: "no request has completed yet: holding the current replica count",
    Reason.FIRST_WINDOW: "first read of the pods: holding the current replica count",
    Reason.SOURCE_DOWN: "the metrics source failed: holding the last recommendation",
    Reason.NO_PODS: "no pod gave a usable sample: holding the last recommendation",
    Reason.MODEL_NOT_FOUND: "no pod serves the configured model_name: holding the last "
    "recommendation",
    Reason.PODS_UNOBSERVED: "some pods could not be observed: their load is estimated from "
    "the others, and the count is not lowered on a partial view",
    Reason.IDLE: "no demand and no request at any pod: 0 replicas once scale_from_zero.idle_s "
    "has passed",
    Reason.SCALED_TO_ZERO: "no demand and no request for scale_from_zero.idle_s: 0 replicas",
    Reason.DEMAND_FROM_ZERO: "demand at 0 replicas: sized from the demand and the kept "
    "calibration (at least 1)",
    Reason.DEMAND_UNKNOWN: "the demand query failed: 0 replicas stay 0 until it answers",
    Reason.HANDOVER: "the calibration is not trusted yet: sized from the observed load with "
    "the last trusted estimate, else the seed, else the prior (exporter.sizing.handover)",
    Reason.FLEET_PLAN: "a variant of a model: the count is the fleet plan's, the least-cost mix "
    "of the model's variants (vllm_sizer_fleet_plan_reason says why)",
}
