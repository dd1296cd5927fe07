"""A quick feasible plan for a fleet whose joint program ran out of time: models in the order
they are served (priority, then demand), each given the cheapest capacity the inventory has
left. Compared with the solver's best plan found; the better stands (neither proven optimal)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from exporter.sizing.fleet.evaluate import allocation, gpus_by_type, served_rps
from exporter.sizing.fleet.single import only
from exporter.sizing.fleet.values import Allocation, FleetInput, Routing, Variant
from model.queueing.sizing import CEIL_SLACK


def greedy(inp: FleetInput, relaxed: Mapping[str, float] | None = None) -> Allocation:
    """The greedy plan from the minimums; with `relaxed` (fractional counts per variant, from
    the relaxation in milp.py), each priority level first gets its models' counts rounded
    down, as far as the GPUs left allow, before its models are filled in turn, each from the
    variant the rounding cut most."""
    floors = None if relaxed is None else {k: math.floor(x + 1e-9) for k, x in relaxed.items()}
    counts = {v.name: v.min_replicas for v in inp.variants}
    used = gpus_by_type(inp, counts)
    free = {k: inp.inventory.get(k, 0) - n for k, n in used.items()}
    order = sorted(inp.models, key=lambda m: (-m.priority, -m.demand_rps, m.name))
    level: int | None = None
    for m in order:
        if floors is not None and m.priority != level:
            level = m.priority
            for v in inp.variants:
                if inp.model(v.model).priority == level:
                    _add(v, min(max(floors[v.name] - counts[v.name], 0), _room(v, counts, free)),
                         counts, free)  # fmt: skip
        alone = only(inp, m.name)  # served rates read over the model's own variants
        if m.routing is Routing.EVEN:
            _even(alone, m.name, list(alone.variants), counts, free)
        else:
            _weighted(alone, m.name, list(alone.variants), counts, free, relaxed)
    return allocation(inp, counts)


def _room(v: Variant, counts: dict[str, int], free: dict[str, int]) -> int:
    return max(min(v.max_replicas - counts[v.name], free[v.accelerator] // v.gpus_per_replica), 0)


def _add(v: Variant, k: int, counts: dict[str, int], free: dict[str, int]) -> None:
    counts[v.name] += k
    free[v.accelerator] -= k * v.gpus_per_replica


def _weighted(
    inp: FleetInput,
    model: str,
    own: list[Variant],
    counts: dict[str, int],
    free: dict[str, int],
    relaxed: Mapping[str, float] | None = None,
) -> None:
    capacity = {v.name: v.sizing_capacity_rps(inp.untrusted_margin) for v in own}
    serving = [v for v in own if capacity[v.name] > 0]

    def order(v: Variant) -> tuple[float, float, str]:
        cut = 0.0 if relaxed is None else math.floor(relaxed[v.name] + 1e-9) - relaxed[v.name]
        return cut, v.cost_per_replica_hour / capacity[v.name], v.name

    for v in sorted(serving, key=order):
        short = inp.model(model).demand_rps - served_rps(inp, model, counts)
        if short <= 0:
            return
        need = math.ceil(short / capacity[v.name] - CEIL_SLACK)
        _add(v, min(need, _room(v, counts, free)), counts, free)


def _even(
    inp: FleetInput, model: str, own: list[Variant], counts: dict[str, int], free: dict[str, int]
) -> None:
    """Replicas of the one variant that, added to those there are, serves the most demand,
    the cheapest of those."""
    demand = inp.model(model).demand_rps
    best: tuple[float, float, int, Variant] | None = None
    for v in own:
        room = _room(v, counts, free)
        for k in range(1, room + 1):
            trial = {**counts, v.name: counts[v.name] + k}
            short = max(demand - served_rps(inp, model, trial), 0.0)
            key = (short, k * v.cost_per_replica_hour, k, v)
            if best is None or key[:2] < best[:2]:
                best = key
            if short <= 0:
                break
    now_short = max(demand - served_rps(inp, model, counts), 0.0)
    if best is not None and best[0] < now_short:
        _add(best[3], best[2], counts, free)
