"""The cheapest mix for a rate: "40 req/s of this model under its targets on these GPUs".

Answered from one model's variants, each with the capacity per replica it is counted at (the
daemon's last plan's, or one computed from parameters by `vllm-sizer plan`), from nothing
running: the least-cost counts within the GPUs given, with no stability share and no scale-down
history. `/api/v1/predict?model=...&rate=...` and `vllm-sizer plan --config ... --fleet-model`
both answer with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from exporter.config.values import DeploymentConfig, FleetConfig, FleetModelConfig
from exporter.sizing.fleet.plan import FleetPlanner
from exporter.sizing.fleet.values import FleetInput, FleetModel, FleetPlan, Variant


@dataclass(frozen=True, slots=True, kw_only=True)
class MixAnswer:
    """The cheapest mix for one model at one rate."""

    model: str
    rate_rps: float
    replicas: Mapping[str, int]  # per variant (deployment)
    capacity_rps: Mapping[str, float]  # per replica, as counted (untrusted margin applied)
    cost_per_hour: float
    unserved_rps: float
    reason: str
    gpus: Mapping[str, int]  # planned, per accelerator type
    gpus_available: Mapping[str, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "rate_requests_per_second": self.rate_rps,
            "replicas": dict(self.replicas),
            "capacity_per_replica_requests_per_second": dict(self.capacity_rps),
            "cost_per_hour": self.cost_per_hour,
            "unserved_requests_per_second": self.unserved_rps,
            "reason": self.reason,
            "gpus_planned": dict(self.gpus),
            "gpus_available": dict(self.gpus_available),
        }


def model_variants(
    fleet: FleetConfig,
    deployments: Mapping[str, DeploymentConfig],
    model: FleetModelConfig,
    capacities: Mapping[str, float],
    trusted: Mapping[str, bool] | None = None,
) -> list[Variant]:
    """The model's variants with nothing running, each at its capacity per replica (req/s; an
    untrusted one is counted at it less the fleet's untrusted margin)."""
    out = []
    for name in model.variants:
        dep = deployments[name]
        assert dep.accelerator is not None  # the configuration requires it of a variant
        out.append(Variant(
            name=name, model=model.name, accelerator=dep.accelerator.value,
            gpus_per_replica=dep.gpus_per_replica,
            price_per_gpu_hour=fleet.accelerator(dep.accelerator).price_per_gpu_hour,
            capacity_rps=capacities[name], min_replicas=dep.min_replicas,
            max_replicas=dep.max_replicas,
            trusted=True if trusted is None else trusted.get(name, True),
        ))  # fmt: skip
    return out


def cheapest_mix(
    variants: list[Variant],
    model: FleetModelConfig,
    rate_rps: float,
    inventory: Mapping[str, int],
    untrusted_margin: float,
) -> MixAnswer:
    """The least-cost counts of `variants` (one model's, nothing running) for `rate_rps`
    within `inventory` (GPUs per type; a type not given has none)."""
    fresh = [replace(v, current_replicas=0, ready_replicas=0) for v in variants]
    floor: dict[str, int] = {}
    for v in fresh:
        floor[v.accelerator] = floor.get(v.accelerator, 0) + v.min_replicas * v.gpus_per_replica
    available = {k: max(inventory.get(k, 0), floor.get(k, 0)) for k in {*inventory, *floor}}
    inp = FleetInput(
        models=(FleetModel(name=model.name, demand_rps=rate_rps, priority=model.priority,
                           routing=model.routing),),
        variants=tuple(fresh), inventory=available, untrusted_margin=untrusted_margin,
    )  # fmt: skip
    plan: FleetPlan = FleetPlanner().decide(0.0, inp)
    return MixAnswer(
        model=model.name, rate_rps=rate_rps, replicas=dict(plan.desired),
        capacity_rps={v.name: v.sizing_capacity_rps(untrusted_margin) for v in fresh},
        cost_per_hour=plan.cost_per_hour, unserved_rps=plan.models[model.name].unserved_rps,
        reason=plan.models[model.name].reason.value, gpus=dict(plan.gpus_planned),
        gpus_available=available,
    )  # fmt: skip


def mix_from_plan(
    fleet: FleetConfig, inp: FleetInput | None, desired: Mapping[str, int], model: str,
    rate_rps: float,
) -> MixAnswer:
    """The cheapest mix from the daemon's last plan: its variants' capacities as it counted
    them, and its GPUs less those its other models' desired replicas take. LookupError for a
    model not configured, or not planned yet."""
    config = next((m for m in fleet.models if m.name == model), None)
    if config is None:
        raise LookupError(f"unknown model {model!r} (not in the `models` section)")
    if inp is None or not any(v.model == model for v in inp.variants):
        raise LookupError(f"model {model!r} has no fleet plan yet")
    taken: dict[str, int] = {}
    for v in inp.variants:
        if v.model != model:
            used = desired.get(v.name, 0) * v.gpus_per_replica
            taken[v.accelerator] = taken.get(v.accelerator, 0) + used
    inventory = {k: max(n - taken.get(k, 0), 0) for k, n in inp.inventory.items()}
    own = [v for v in inp.variants if v.model == model]
    return cheapest_mix(own, config, rate_rps, inventory, fleet.untrusted_margin)
