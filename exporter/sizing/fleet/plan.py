"""The fleet decision of one cycle: the least-cost plan, kept when a new mix saves too little,
held up while replacements start and by scale-down stabilization, always within the GPUs
there are.

Pure apart from the per-variant stabilization history: the caller passes the time in.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace

from exporter.sizing.fleet.evaluate import SAME_RELATIVE, cost_per_hour, gpus_by_type, rank
from exporter.sizing.fleet.milp import solve
from exporter.sizing.fleet.values import (
    Allocation,
    FleetInput,
    FleetPlan,
    ModelPlan,
    PlanReason,
    Variant,
)
from exporter.sizing.stabilization import ScaleDownWindow

# The fleet's reason is the first of these any model has.
_PLAN_ORDER = (
    PlanReason.PRIORITY_LIMITED,
    PlanReason.INVENTORY_LIMITED,
    PlanReason.MAX_REPLICAS,
    PlanReason.KEPT_FOR_STABILITY,
    PlanReason.LEAST_COST,
    PlanReason.NO_DEMAND,
)


def choose(inp: FleetInput) -> tuple[Allocation, set[str]]:
    """The plan to run and the models kept on their current mix: the least-cost plan, unless
    the current mix (the variants with replicas now, resized for the demand) serves as much
    demand at every priority and costs less than 1 / (1 - switch_saving) times as much.
    Both solves share the input's solver time: the second gets what the first left, at least
    a tenth (a solve out of time keeps the better of its best plan and the greedy one)."""
    began = time.perf_counter()
    best = solve(inp)
    caps: dict[str, int] = {}
    for m in inp.models:
        own = inp.own(m.name)
        if any(v.current_replicas > 0 for v in own):  # with nothing running, no mix to keep
            caps.update({v.name: 0 for v in own if v.current_replicas == 0})
    if all(best.replicas[name] <= cap for name, cap in caps.items()):
        return best, set()
    limit_s = inp.solve_time_limit_s
    left_s = max(limit_s - (time.perf_counter() - began), 0.1 * limit_s)
    kept = solve(replace(inp, solve_time_limit_s=left_s), caps)
    levels_kept, levels_best = rank(inp, kept)[:-1], rank(inp, best)[:-1]
    serves_as_much = all(
        k <= b + SAME_RELATIVE * (1.0 + b) for k, b in zip(levels_kept, levels_best, strict=True)
    )
    if not serves_as_much or best.cost_per_hour < (1.0 - inp.switch_saving) * kept.cost_per_hour:
        return best, set()
    changed = {v.model for v in inp.variants if kept.replicas[v.name] != best.replicas[v.name]}
    return kept, changed


def model_reasons(inp: FleetInput, plan: Allocation, kept: set[str]) -> dict[str, PlanReason]:
    """Each model's reason: why demand is unserved when some is, else how the counts came."""
    reasons: dict[str, PlanReason] = {}
    for m in inp.models:
        own = inp.own(m.name)
        if plan.unserved_rps[m.name] > 0:
            if all(plan.replicas[v.name] >= v.max_replicas for v in own):
                reasons[m.name] = PlanReason.MAX_REPLICAS
            elif _outranked(inp, plan, m.priority, {v.accelerator for v in own}):
                reasons[m.name] = PlanReason.PRIORITY_LIMITED
            else:
                reasons[m.name] = PlanReason.INVENTORY_LIMITED
        elif m.name in kept:
            reasons[m.name] = PlanReason.KEPT_FOR_STABILITY
        elif m.demand_rps <= 0:
            reasons[m.name] = PlanReason.NO_DEMAND
        else:
            reasons[m.name] = PlanReason.LEAST_COST
    return reasons


def _outranked(inp: FleetInput, plan: Allocation, priority: int, kinds: set[str]) -> bool:
    """A higher-priority model runs more than its minimum on a GPU type in `kinds`."""
    higher = {m.name for m in inp.models if m.priority > priority}
    return any(
        v.model in higher and v.accelerator in kinds and plan.replicas[v.name] > v.min_replicas
        for v in inp.variants
    )


def replacement_holds(inp: FleetInput, target: Mapping[str, int]) -> dict[str, int]:
    """Make-before-break: while any variant of a model has fewer ready replicas than planned,
    the model's variants being scaled down keep their current replicas."""
    pending = {v.model for v in inp.variants if v.ready_replicas < target[v.name]}
    return {
        v.name: v.current_replicas
        for v in inp.variants
        if v.model in pending and v.current_replicas > target[v.name]
    }


def within_inventory(
    inp: FleetInput, target: Mapping[str, int], wanted: Mapping[str, int]
) -> dict[str, int]:
    """`wanted` (at least `target`) cut to the inventory: the target fits, and what is held
    above it is granted replica by replica, the highest-priority model first."""
    desired = dict(target)
    free = {k: inp.inventory.get(k, 0) - used for k, used in gpus_by_type(inp, target).items()}
    order = sorted(inp.variants, key=lambda v: (-inp.model(v.model).priority, v.name))
    for v in order:
        extra = max(min(wanted[v.name], v.max_replicas) - target[v.name], 0)
        fits = max(free[v.accelerator], 0) // v.gpus_per_replica
        granted = min(extra, fits)
        desired[v.name] += granted
        free[v.accelerator] -= granted * v.gpus_per_replica
    return desired


class FleetPlanner:
    """The fleet decision across cycles: each variant's scale-down stabilization window."""

    def __init__(self) -> None:
        self._windows: dict[str, tuple[tuple[int, float], ScaleDownWindow]] = {}
    def decide(self, now_s: float, inp: FleetInput) -> FleetPlan:
        """This cycle's plan at wall time now_s (s)."""
        chosen, kept = choose(inp)
        target = dict(chosen.replicas)
        holds = replacement_holds(inp, target)
        wanted = {
            v.name: max(self._stabilized(now_s, v, target[v.name]), holds.get(v.name, 0))
            for v in inp.variants
        }
        desired = within_inventory(inp, target, wanted)
        reasons = model_reasons(inp, chosen, kept)
        models = {
            m.name: ModelPlan(
                reason=reasons[m.name],
                cost_per_hour=sum(desired[v.name] * v.cost_per_replica_hour
                                  for v in inp.own(m.name)),
                unserved_rps=chosen.unserved_rps[m.name],
            )
            for m in inp.models
        }
        present = set(reasons.values())
        return FleetPlan(
            reason=next((r for r in _PLAN_ORDER if r in present), PlanReason.NO_DEMAND),
            target=target,
            desired=desired,
            models=models,
            gpus_planned=gpus_by_type(inp, desired),
            cost_per_hour=cost_per_hour(inp, desired),
            optimal=chosen.optimal,
        )

    def _stabilized(self, now_s: float, v: Variant, count: int) -> int:
        """The highest count planned for `v` within its stabilization window, by the same
        window as the recommender's. A changed window or maximum keeps the history that
        still falls in the window, clamped to the maximum, as a restart restores it."""
        key = (v.max_replicas, v.stabilization_s)
        held = self._windows.get(v.name)
        if held is None or held[0] != key:
            window = ScaleDownWindow(v.stabilization_s)
            if held is not None:
                window.restore(held[1].entries(), now_s, 0, v.max_replicas)
            held = (key, window)
            self._windows[v.name] = held
        return held[1].hold(now_s, count)
