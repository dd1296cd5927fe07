"""A fleet model never plans 0 replicas on every variant: without a pod its demand is not seen."""

from __future__ import annotations

from exporter.sizing.fleet.plan import FleetPlanner
from exporter.sizing.fleet.values import FleetInput, FleetModel, PlanReason, Variant
from exporter.sizing.fleet_cycle import keep_one


def variant(name: str, kind: str, price: float, gpus: int = 1) -> Variant:
    return Variant(name=name, model="m", accelerator=kind, gpus_per_replica=gpus,
                   price_per_gpu_hour=price, capacity_rps=5.0)


def plan_for(demand: float, inventory: dict[str, int]) -> tuple[FleetInput, dict[str, int]]:
    inp = FleetInput(models=(FleetModel(name="m", demand_rps=demand),),
                     variants=(variant("big", "H100", 4.0), variant("small", "L40S", 1.0)),
                     inventory=inventory)
    plan = keep_one(FleetPlanner().decide(0.0, inp), inp)
    return inp, dict(plan.desired)


def test_no_demand_keeps_one_replica_on_the_cheapest_variant_with_room() -> None:
    inp = FleetInput(models=(FleetModel(name="m", demand_rps=0.0),),
                     variants=(variant("big", "H100", 4.0), variant("small", "L40S", 1.0)),
                     inventory={"H100": 2, "L40S": 2})
    raw = FleetPlanner().decide(0.0, inp)
    assert raw.reason is PlanReason.NO_DEMAND and sum(raw.desired.values()) == 0  # the optimizer
    kept = keep_one(raw, inp)
    assert dict(kept.desired) == {"big": 0, "small": 1}
    assert kept.cost_per_hour == 1.0 and dict(kept.gpus_planned) == {"H100": 0, "L40S": 1}
    assert kept.models["m"].cost_per_hour == 1.0


def test_without_room_on_the_cheap_type_the_one_replica_goes_elsewhere() -> None:
    _, desired = plan_for(0.0, {"H100": 2, "L40S": 0})
    assert desired == {"big": 1, "small": 0}


def test_a_plan_with_replicas_is_left_alone() -> None:
    _, desired = plan_for(12.0, {"H100": 2, "L40S": 8})
    assert desired == {"big": 0, "small": 3}
