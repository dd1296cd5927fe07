"""The fleet decision of one cycle: the least-cost plan, kept when a new mix saves too little,
held up while replacements start and by scale-down stabilization, always within the GPUs
there are.

Pure apart from the per-variant stabilization history: the caller passes the time in.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from exporter.sizing.fleet.evaluate import (
    SAME_RELATIVE,
    allocation,
    cost_per_hour,
    gpus_by_type,
    rank,
    within_limits,
)
from exporter.sizing.fleet.milp import solve
from exporter.sizing.fleet.steady import CapacityHold, StickyDemand
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


@dataclass(frozen=True, slots=True)
class Choice:
    """The plan to run, the models kept on a mix that is not the least-cost one, and what the
    least-cost plan would save per hour ($) where it is held off only until it pays back the
    replicas a switch strands (0: nothing held off)."""

    plan: Allocation
    kept: set[str]
    held_off_saving_per_hour: float = 0.0


def choose(
    inp: FleetInput, previous: Mapping[str, int] | None = None, credit: float | None = None
) -> Choice:
    """The plan to run: the least-cost plan, unless the current mix (the variants with
    replicas now that the previous target kept, resized for the demand) serves as
    much demand at every priority and costs less than 1 / (1 - switch_saving) times as much.
    The previous target itself is kept, unresized, when it serves as much and the least-cost
    plan saves less than that share on it: a scale-up is never held back (the previous
    target must serve as much), a small saving does not move the plan.

    `credit` ($): what the least-cost mix has saved over the kept one so far (the caller
    adds each cycle's `held_off_saving_per_hour` times its length). A switch strands the
    replicas it scales down for their stabilization window and pays for the replicas it adds
    while they start (`switch_cost`); the kept mix stays until the credit pays for that
    (break-even, as renting until the rent paid would have bought):
    a cheaper mix that lasts less than that is never switched to and back. None: no such
    wait (a one-off plan).

    Both solves share the input's solver time: the second gets what the first left, at
    least a tenth (a solve out of time keeps the better of its best plan and the greedy
    one)."""
    began = time.perf_counter()
    best = solve(inp)
    if previous is not None:
        held = _previous_kept(inp, best, previous)
        if held is not None:
            return held
    in_use = _in_use(inp, previous)
    caps: dict[str, int] = {}
    for m in inp.models:
        own = inp.own(m.name)
        if any(in_use[v.name] for v in own):  # with nothing running, no mix to keep
            caps.update({v.name: 0 for v in own if not in_use[v.name]})
    if all(best.replicas[name] <= cap for name, cap in caps.items()):
        return Choice(best, set())
    limit_s = inp.solve_time_limit_s
    left_s = max(limit_s - (time.perf_counter() - began), 0.1 * limit_s)
    kept = solve(replace(inp, solve_time_limit_s=left_s), caps)
    if not _serves_as_much(inp, kept, best):
        return Choice(best, set())
    changed = {v.model for v in inp.variants if kept.replicas[v.name] != best.replicas[v.name]}
    if _keeps(inp, kept, best):
        return Choice(kept, changed)
    if credit is not None and credit < switch_cost(inp, kept.replicas, best.replicas):
        return Choice(kept, changed, kept.cost_per_hour - best.cost_per_hour)
    return Choice(best, set())


def switch_cost(inp: FleetInput, kept: Mapping[str, int], best: Mapping[str, int]) -> float:
    """What switching from `kept` to `best` pays ($) beyond running `best`: the replicas it
    scales down, while their stabilization windows hold them, and the replicas it adds,
    while they start (their startup delay)."""
    return sum(
        (max(kept[v.name] - best[v.name], 0) * v.stabilization_s
         + max(best[v.name] - kept[v.name], 0) * v.startup_delay_s)
        * v.cost_per_replica_hour / 3600.0
        for v in inp.variants
    )  # fmt: skip


def _in_use(inp: FleetInput, previous: Mapping[str, int] | None) -> dict[str, bool]:
    """The variants of the mix to keep: those with replicas now that the previous target
    (where there is one) kept. Replicas held only by stabilization or make-before-break are
    on their way out, not the mix."""
    return {
        v.name: v.current_replicas > 0 and (previous is None or previous.get(v.name, 1) > 0)
        for v in inp.variants
    }


def _serves_as_much(inp: FleetInput, kept: Allocation, best: Allocation) -> bool:
    levels_kept, levels_best = rank(inp, kept)[:-1], rank(inp, best)[:-1]
    return all(
        k <= b + SAME_RELATIVE * (1.0 + b) for k, b in zip(levels_kept, levels_best, strict=True)
    )


def _keeps(inp: FleetInput, kept: Allocation, best: Allocation) -> bool:
    """`kept` serves as much at every priority and costs less than 1 / (1 - switch_saving)
    times `best`."""
    return _serves_as_much(inp, kept, best) and (
        best.cost_per_hour >= (1.0 - inp.switch_saving) * kept.cost_per_hour
    )


def _previous_kept(
    inp: FleetInput, best: Allocation, previous: Mapping[str, int]
) -> Choice | None:
    """The previous target as it stands, when it is still a plan (within every bound and the
    inventory) that `_keeps` against the least-cost one; None otherwise."""
    if any(v.name not in previous for v in inp.variants):
        return None
    counts = {v.name: previous[v.name] for v in inp.variants}
    if not within_limits(inp, counts):
        return None
    kept = replace(allocation(inp, counts), optimal=best.optimal)
    if not _keeps(inp, kept, best):
        return None
    changed = {v.model for v in inp.variants if counts[v.name] != best.replicas[v.name]}
    return Choice(kept, changed)


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
    """The fleet decision across cycles: each variant's scale-down stabilization window, its
    published capacity and each model's demand held steady (exporter/sizing/fleet/steady.py),
    and the previous target the next one must save enough on to replace."""

    def __init__(self, *, steady: bool = True) -> None:
        """`steady` False: plan on the inputs as given (a one-off plan, a test)."""
        self._windows: dict[str, tuple[tuple[int, float], ScaleDownWindow]] = {}
        self._steady = steady
        self.capacities = CapacityHold()
        self.demand = StickyDemand()
        self._previous: dict[str, int] | None = None
        self._credit = 0.0  # $ a held-off cheaper mix has saved so far (see choose)
        self._last_s: float | None = None
        self.last_input: FleetInput | None = None  # the last plan's input, as held
        self._saved_windows: dict[str, list[tuple[float, int]]] = {}  # restored, not yet used

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe state: what a restarted daemon needs to plan as it would have."""
        windows = {name: [[t, c] for t, c in w.entries()] for name, (_, w) in self._windows.items()}
        return {
            "windows": {**{k: [[t, c] for t, c in v] for k, v in self._saved_windows.items()},
                        **windows},
            "previous": self._previous,
            "credit": self._credit,
            "last_s": self._last_s,
            "capacities": self.capacities.to_dict(),
            "demand": self.demand.to_dict(),
        }  # fmt: skip

    def restore(self, data: Mapping[str, Any], now_s: float) -> None:
        """Load what `to_dict` saved at `now_s` (s): the windows keep their entries within
        their span once their variants are next planned. Raises ValueError, TypeError,
        KeyError or AttributeError on a bad shape (nothing is assigned then)."""
        windows = {
            str(name): [(float(t), int(c)) for t, c in entries]
            for name, entries in data["windows"].items()
        }
        previous = data["previous"]
        previous = None if previous is None else {str(k): int(n) for k, n in previous.items()}
        credit = float(data["credit"])
        last_s = data["last_s"]
        last_s = None if last_s is None else min(float(last_s), now_s)
        capacities, demand = CapacityHold(), StickyDemand(self.demand.drop_share)
        capacities.restore(data["capacities"])
        demand.restore(data["demand"])
        if not math.isfinite(credit) or credit < 0:
            raise ValueError(f"credit: {credit!r}")
        self._saved_windows, self._windows = windows, {}
        self._previous, self._credit, self._last_s = previous, credit, last_s
        self.capacities, self.demand = capacities, demand

    def held(self, inp: FleetInput) -> FleetInput:
        """`inp` with each variant's capacity and each model's demand as published."""
        if not self._steady:
            return inp
        variants = []
        for v in inp.variants:
            if v.trusted or v.prior_capacity_rps is None:
                v = replace(v, capacity_rps=self.capacities.publish(v.name, v.capacity_rps,
                                                                    v.trusted))
            else:
                prior = self.capacities.publish(v.name, v.prior_capacity_rps, v.trusted)
                v = replace(v, prior_capacity_rps=prior)
            variants.append(v)
        models = tuple(replace(m, demand_rps=self.demand.publish(m.name, m.demand_rps))
                       for m in inp.models)  # fmt: skip
        return replace(inp, models=models, variants=tuple(variants))

    def decide(self, now_s: float, inp: FleetInput) -> FleetPlan:
        """This cycle's plan at wall time now_s (s)."""
        inp = self.held(inp)
        self.last_input = inp
        if not self._steady:
            choice = choose(inp)
        else:
            choice = choose(inp, self._previous, self._credit)
            saving = choice.held_off_saving_per_hour
            elapsed_s = 0.0 if self._last_s is None else max(now_s - self._last_s, 0.0)
            self._credit = self._credit + saving * elapsed_s / 3600.0 if saving > 0 else 0.0
            self._last_s = now_s
        chosen, kept = choice.plan, choice.kept
        self._previous = {**(self._previous or {}), **chosen.replicas}
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
            entries = held[1].entries() if held else self._saved_windows.pop(v.name, [])
            window.restore(entries, now_s, 0, v.max_replicas)
            held = (key, window)
            self._windows[v.name] = held
        return held[1].hold(now_s, count)
