"""What a set of replica counts serves and costs, computed exactly (no solver): the yardstick
the optimizer's answer is read back with, and the order plans are ranked in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from exporter.sizing.fleet.values import Allocation, FleetInput, FleetModel, Routing, Variant
from model.queueing.sizing import CEIL_SLACK

# Objective values closer than this (relative) are the same: the solver's own tolerances.
SAME_RELATIVE = 1e-6


def served_rps(inp: FleetInput, model: str, replicas: Mapping[str, int]) -> float:
    """The rate the model's replicas carry within their SLO capacity under its routing rule:
    `weighted` adds every replica's capacity; `even` gives every replica the same share, so
    the smallest capacity among the variants in use bounds them all."""
    own = inp.own(model)
    return _served(inp, inp.model(model).routing, own, replicas)


def unserved_rps(inp: FleetInput, model: str, replicas: Mapping[str, int]) -> float:
    """Demand beyond what the counts carry (req/s); a shortfall within the recommender's
    rounding slack (a replica count of ceil(demand / capacity - CEIL_SLACK)) is none."""
    own = inp.own(model)
    return _unserved(inp, inp.model(model), own, replicas)


def _served(
    inp: FleetInput, routing: Routing, own: Sequence[Variant], replicas: Mapping[str, int]
) -> float:
    used = [
        (replicas[v.name], v.sizing_capacity_rps(inp.untrusted_margin))
        for v in own
        if replicas[v.name] > 0
    ]
    if not used:
        return 0.0
    if routing is Routing.EVEN:
        return sum(n for n, _ in used) * min(c for _, c in used)
    return sum(n * c for n, c in used)


def _unserved(
    inp: FleetInput, m: FleetModel, own: Sequence[Variant], replicas: Mapping[str, int]
) -> float:
    served = _served(inp, m.routing, own, replicas)
    slack = CEIL_SLACK * max((v.sizing_capacity_rps(inp.untrusted_margin) for v in own),
                             default=0.0)
    return 0.0 if served + slack >= m.demand_rps else m.demand_rps - served


def cost_per_hour(inp: FleetInput, replicas: Mapping[str, int]) -> float:
    return sum(replicas[v.name] * v.cost_per_replica_hour for v in inp.variants)


def gpus_by_type(inp: FleetInput, replicas: Mapping[str, int]) -> dict[str, int]:
    used: dict[str, int] = {kind: 0 for kind in inp.inventory}
    for v in inp.variants:
        used[v.accelerator] = used.get(v.accelerator, 0) + replicas[v.name] * v.gpus_per_replica
    return used


def within_limits(inp: FleetInput, replicas: Mapping[str, int]) -> bool:
    """Every count within its variant's min/max, every type within its inventory."""
    if any(not v.min_replicas <= replicas[v.name] <= v.max_replicas for v in inp.variants):
        return False
    used = gpus_by_type(inp, replicas)
    return all(used[kind] <= inp.inventory.get(kind, 0) for kind in used)


def allocation(inp: FleetInput, replicas: Mapping[str, int]) -> Allocation:
    """The counts with their exact unserved demand and cost."""
    counts = {v.name: int(replicas[v.name]) for v in inp.variants}
    return Allocation(
        replicas=counts,
        unserved_rps={m.name: _unserved(inp, m, inp.own(m.name), counts) for m in inp.models},
        cost_per_hour=cost_per_hour(inp, counts),
    )


def priorities(inp: FleetInput) -> list[int]:
    """The priority levels, highest first."""
    return sorted({m.priority for m in inp.models}, reverse=True)


def rank(inp: FleetInput, plan: Allocation) -> tuple[float, ...]:
    """The order plans are chosen in, smallest first: unserved demand of each priority level
    (highest first), then the cost per hour."""
    levels = [
        sum(plan.unserved_rps[m.name] for m in inp.models if m.priority == level)
        for level in priorities(inp)
    ]
    return (*levels, plan.cost_per_hour)


def no_worse(inp: FleetInput, a: Allocation, b: Allocation) -> bool:
    """Plan a ranks at most as high as b, within the solver's tolerance."""
    for x, y in zip(rank(inp, a), rank(inp, b), strict=True):
        if x > y + SAME_RELATIVE * (1.0 + abs(y)):
            return False
        if x < y - SAME_RELATIVE * (1.0 + abs(y)):
            return True
    return True
