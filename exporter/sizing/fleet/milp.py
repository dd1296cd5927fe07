"""The least-cost integer plan over all models at once: a mixed-integer program solved by
HiGHS (`scipy.optimize.milp`).

Variables: n_v replicas of each variant (integer, within min/max), u_m the unserved share of
each model's demand (continuous, 0..1) and, for each variant of an `even` model, y_v in {0, 1}
(the variant is in use). Rows, each scaled by the model's demand d_m so the solver's
tolerances are relative:
  * every model:   sum_v c_v n_v / d_m + u_m >= 1
  * `even` model, each variant v:  c_v N_m / d_m + u_m - y_v >= 0, and n_v <= max_v y_v,
    N_m the model's replicas: a variant with a replica (y_v = 1) bounds the rate every replica
    gets, d_m (1 - u_m) / N_m <= c_v. This is the routing rule exactly (a big-M
    linearisation with M = d_m); the weighted row is implied while any variant is in use and
    keeps u_m = 1 when none is.
  * every accelerator type: sum_v g_v n_v <= inventory.
The objective is lexicographic, one solve per stage: with all demand served the cheapest plan
(one solve, the usual case); else the unserved demand of each priority level in turn, highest
first, each later stage holding the earlier optimum, then the cost.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_array

from exporter.sizing.fleet.candidates import choice
from exporter.sizing.fleet.evaluate import allocation, no_worse, priorities, within_limits
from exporter.sizing.fleet.greedy import greedy
from exporter.sizing.fleet.single import best_alone, only
from exporter.sizing.fleet.values import Allocation, FleetInput, Routing

# A stage's optimum is held with this relative slack in the later stages (the solver's
# feasibility tolerance is 1e-7; a tighter hold can make presolve call the stage infeasible).
HOLD_SLACK = 1e-6
# HiGHS's feasibility-jump heuristic (see _run).
FEASIBILITY_JUMP = False
# Models a stage holds all served choose among whole candidate plans (see _run). Exact, but
# measured no faster and no tighter on the fleets of bench/fleet_speed.py (see
# bench/fleet_formulations.py), so off.
CANDIDATES = False


@dataclass(frozen=True, slots=True)
class _Program:
    cost: NDArray[np.float64]
    integrality: NDArray[np.int_]
    lower: NDArray[np.float64]
    upper: NDArray[np.float64]
    rows: LinearConstraint
    unserved: dict[int, NDArray[np.float64]]  # priority -> objective over u (req/s unserved)
    n_variants: int
    deadline_s: float  # time.perf_counter() when the plan's solver time is out
    floor_s: float  # a stage's time at least (HiGHS needs some)

    def stage_limit_s(self, stages_left: int) -> float:
        """An even share of the time left among the stages still to run: a stage skipped or
        finished early leaves its time to the later ones."""
        left = self.deadline_s - time.perf_counter()
        return max(left / max(stages_left, 1), self.floor_s)
    trivial: NDArray[np.float64]  # every variant at its minimum, all demand unserved
    in_use: dict[int, int]  # variant of an `even` model -> its y column


def solve(inp: FleetInput, caps: Mapping[str, int] | None = None) -> Allocation:
    """The lexicographically best plan (unserved demand by priority, then cost); `caps`
    lowers variants' maximums (a variant's minimum still stands).

    Models are coupled only by the inventory, so each is solved alone first (without the
    inventory, exactly, by exporter.sizing.fleet.single): when their plans fit the inventory
    together they are the joint optimum (the objective is a sum over models and each is at
    the optimum of a relaxation), found without branching over every model's choices at once,
    which is what makes one joint solve slow on many models. Otherwise the joint program
    decides; when it runs out of time, the better of its best plan and a greedy one stands
    (`optimal` False)."""
    caps = caps or {}
    capped = replace(
        inp,
        variants=tuple(
            replace(v, max_replicas=max(min(v.max_replicas, caps[v.name]), v.min_replicas))
            if v.name in caps
            else v
            for v in inp.variants
        ),
    )
    parts = {m.name: _alone(capped, m.name) for m in capped.models}
    counts = {v.name: parts[v.model].replicas[v.name] for v in capped.variants}
    if within_limits(capped, counts):
        optimal = all(part.optimal for part in parts.values())
        return replace(allocation(inp, counts), optimal=optimal)
    # A model short on its own is short in the fleet: no plan serves everything.
    servable = all(u <= 0 for part in parts.values() for u in part.unserved_rps.values())
    return solve_joint(capped, servable=servable and not gpus_short(capped))


# The bound below proves the all-served stage infeasible only beyond the solver's own
# feasibility tolerance (1e-7 on rows scaled by demand), so it skips exactly the stages the
# solver would call infeasible.
_BOUND_SLACK = 1e-6


def gpus_short(inp: FleetInput) -> bool:
    """True when the GPUs there are, all types together, cannot carry every model's demand
    even in fractions of replicas: each model needs at least its demand over the most
    requests per GPU any of its variants serves. A relaxation, so True proves that no plan
    serves all demand (the joint program's first stage is then skipped, not solved)."""
    needed = 0.0
    for m in inp.models:
        if m.demand_rps <= 0:
            continue
        per_gpu = max((v.sizing_capacity_rps(inp.untrusted_margin) / v.gpus_per_replica
                       for v in inp.own(m.name)), default=0.0)
        if per_gpu <= 0:
            return True
        needed += m.demand_rps / per_gpu
    return needed * (1.0 - _BOUND_SLACK) > sum(inp.inventory.values())


def _alone(inp: FleetInput, model: str) -> Allocation:
    """The model's best plan over its own variants, the other models away."""
    return best_alone(inp, model) or solve_joint(only(inp, model))


def solve_joint(inp: FleetInput, *, servable: bool = True) -> Allocation:
    """The joint program's plan, all models in one MILP (the staged objective above);
    `servable` False skips the stage that serves all demand (known to have no plan). A
    greedy plan that serves a priority level entirely, while meeting what the levels above
    were held to, shows that level's optimum is none unserved: its stage is skipped. When a
    stage runs out of time, the best of the solver's plan, the greedy one and the rounded
    relaxation stands."""
    program = _build(inp)
    quick = replace(greedy(inp), optimal=False)
    proven = True
    if servable:
        upper_served = program.upper.copy()
        upper_served[program.n_variants : program.n_variants + len(inp.models)] = 0.0
        limit_s = program.stage_limit_s(len(program.unserved) + 2)
        first, proven = _run(program, program.cost, [program.rows], upper_served, inp, limit_s)
        if first is not None:
            return _read(inp, first, proven)
    rows, upper = [program.rows], program.upper.copy()
    x, optimal = program.trivial, proven  # not proven infeasible: not proven optimal
    quick_holds = True  # the greedy plan meets every hold so far
    levels = priorities(inp)
    for done, level in enumerate(levels):
        goal = program.unserved[level]
        quick_level = sum(quick.unserved_rps[m.name] for m in inp.models if m.priority == level)
        if quick_holds and quick_level <= 0.0:
            best, x = 0.0, _point(inp, program, quick)
        else:
            # Models below this level only take GPUs from it here: at their minimums they
            # leave every plan of this stage feasible, so its optimum is the same.
            below = np.array([inp.model(v.model).priority < level for v in inp.variants])
            stage_upper = upper.copy()
            stage_upper[: program.n_variants][below] = program.lower[: program.n_variants][below]
            limit_s = program.stage_limit_s(len(levels) - done + 1)  # and the cost stage
            x, proven = _staged(program, goal, rows, stage_upper, x, inp, limit_s)
            optimal = optimal and proven
            best = float(goal @ x)
            quick_holds = quick_holds and quick_level <= best * (1 + HOLD_SLACK)
        if best <= 0.0:
            # All of the level served: held by bounds, which presolve handles more robustly
            # than a row with a zero right-hand side.
            upper[goal > 0] = 0.0
        else:
            hold = LinearConstraint(goal[np.newaxis, :], -np.inf, best * (1 + HOLD_SLACK))
            rows = [*rows, hold]
    if not optimal:  # within the budget, before the cost stage takes what is left
        rounded = _rounded(inp, program)
        if rounded is not None and no_worse(inp, rounded, quick):
            quick = rounded
    x, proven = _staged(program, program.cost, rows, upper, x, inp, program.stage_limit_s(1))
    joint = _read(inp, x, optimal and proven)
    if joint.optimal or no_worse(inp, joint, quick):
        return joint
    return quick


def _rounded(inp: FleetInput, program: _Program) -> Allocation | None:
    """A quick plan for a program out of time: its relaxation (replicas in fractions, the
    same stages), every count rounded down, then filled greedily, level by level.
    On 200 models the relaxation puts the GPUs where an integer plan wants them far better
    than the greedy order does; never proven, so only compared (None: no relaxation)."""
    relaxed = replace(program, integrality=np.zeros_like(program.integrality))
    rows, upper = [program.rows], program.upper.copy()
    x: NDArray[np.float64] | None = None
    for level in priorities(inp):
        goal = program.unserved[level]
        x, _ = _run(relaxed, goal, rows, upper, inp, program.floor_s * 10)
        if x is None:
            return None
        hold = LinearConstraint(goal[np.newaxis, :], -np.inf, float(goal @ x) * (1 + HOLD_SLACK))
        rows = [*rows, hold]
    if x is None:
        return None
    relaxed_counts = {v.name: float(x[i]) for i, v in enumerate(inp.variants)}
    return replace(greedy(inp, relaxed_counts), optimal=False)


def _staged(
    program: _Program,
    objective: NDArray[np.float64],
    rows: list[LinearConstraint],
    upper: NDArray[np.float64],
    fallback: NDArray[np.float64],
    inp: FleetInput,
    limit_s: float,
) -> tuple[NDArray[np.float64], bool]:
    """A later stage's solution and whether it is proven optimal. The stage has one (the
    previous stage's, which meets every row so far), so a failure is presolve's and is
    retried without it; with no solution in the time limit, the previous one stands."""
    x, proven = _run(program, objective, rows, upper, inp, limit_s)
    if x is None and proven:
        x, proven = _run(program, objective, rows, upper, inp, limit_s, presolve=False)
    return (fallback, False) if x is None else (x, proven)


def _run(
    program: _Program,
    objective: NDArray[np.float64],
    rows: list[LinearConstraint],
    upper: NDArray[np.float64],
    inp: FleetInput,
    limit_s: float,
    *,
    presolve: bool = True,
) -> tuple[NDArray[np.float64] | None, bool]:
    """The solution (None: none found) and whether the solver finished (proved it optimal,
    or proved there is none). The models `upper` holds all served choose among their
    candidate plans (exporter.sizing.fleet.candidates) when CANDIDATES is on."""
    integrality, lower = program.integrality, program.lower
    n_v, width = program.n_variants, len(objective)
    settled = {m.name for j, m in enumerate(inp.models) if upper[n_v + j] <= 0.0}
    extra = choice(inp, settled, width) if CANDIDATES and settled else None
    if extra is not None:
        k = extra.n_columns
        objective = np.concatenate((objective, np.zeros(k)))
        integrality = np.concatenate((integrality, np.ones(k, dtype=np.int_)))
        lower = np.concatenate((lower, np.zeros(k)))
        upper = np.concatenate((upper, np.ones(k)))
        rows = [*(extra.widen(r) for r in rows), extra.rows]
    with warnings.catch_warnings():
        # scipy checks options against its own list, which lacks the HiGHS one set below,
        # and passes it on to HiGHS as given, with a warning.
        warnings.filterwarnings("ignore", "Unrecognized options", RuntimeWarning)
        result = milp(
            objective,
            integrality=integrality,
            bounds=Bounds(lower, upper),
            constraints=rows,
            options={  # type: ignore[arg-type]  # the HiGHS option scipy's stubs do not list
                # Optimal, not within HiGHS's default 0.01 % gap.
                "mip_rel_gap": 0.0,
                "presolve": presolve,
                "time_limit": limit_s,
                # A primal heuristic run before the root: on these programs it costs about half
                # of each solve (4.5 of 8 ms CPU on a 3-model stage) and the root finds the plan
                # anyway. Heuristics never change what is proven, only how fast.
                "mip_heuristic_run_feasibility_jump": FEASIBILITY_JUMP,
            },
        )
    finished = result.status in (0, 2)  # optimal, infeasible (1: time limit)
    x = None if result.x is None else np.asarray(result.x[:width], dtype=np.float64)
    return x, finished


def _point(inp: FleetInput, program: _Program, plan: Allocation) -> NDArray[np.float64]:
    """A plan as a point of the program: counts, unserved shares, variants in use."""
    x = program.trivial.copy()
    n_v = program.n_variants
    for i, v in enumerate(inp.variants):
        x[i] = plan.replicas[v.name]
    for j, m in enumerate(inp.models):
        x[n_v + j] = plan.unserved_rps[m.name] / m.demand_rps if m.demand_rps > 0 else 0.0
    for i, column in program.in_use.items():
        x[column] = 1.0 if x[i] > 0 else 0.0
    return x


def _read(inp: FleetInput, x: NDArray[np.float64], optimal: bool) -> Allocation:
    counts = {v.name: int(round(x[i])) for i, v in enumerate(inp.variants)}
    return replace(allocation(inp, counts), optimal=optimal)


def _build(inp: FleetInput) -> _Program:
    variants, models = inp.variants, inp.models
    n_v, n_m = len(variants), len(models)
    model_index = {m.name: j for j, m in enumerate(models)}
    even = [i for i, v in enumerate(variants) if inp.model(v.model).routing is Routing.EVEN]
    y_index = {i: n_v + n_m + k for k, i in enumerate(even)}
    size = n_v + n_m + len(even)
    capacity = [v.sizing_capacity_rps(inp.untrusted_margin) for v in variants]

    cost = np.zeros(size)
    lower, upper = np.zeros(size), np.ones(size)
    integrality = np.ones(size, dtype=np.int_)
    integrality[n_v : n_v + n_m] = 0
    for i, v in enumerate(variants):
        cost[i] = v.cost_per_replica_hour
        lower[i] = v.min_replicas
        upper[i] = v.max_replicas

    entries: list[tuple[int, int, float]] = []
    row_lo: list[float] = []
    row_hi: list[float] = []

    def row(coefficients: list[tuple[int, float]], lo: float, hi: float) -> None:
        r = len(row_lo)
        entries.extend((r, col, value) for col, value in coefficients)
        row_lo.append(lo)
        row_hi.append(hi)

    members: dict[int, list[int]] = {j: [] for j in range(n_m)}
    for i, v in enumerate(variants):
        members[model_index[v.model]].append(i)
    unserved = {level: np.zeros(size) for level in priorities(inp)}
    for j, m in enumerate(models):
        if m.demand_rps <= 0:
            upper[n_v + j] = 0.0
            continue
        d = m.demand_rps
        unserved[m.priority][n_v + j] = d
        row([*((i, capacity[i] / d) for i in members[j]), (n_v + j, 1.0)], 1.0, np.inf)
        if m.routing is not Routing.EVEN:
            continue
        for i in members[j]:
            y = y_index[i]
            row(
                [*((k, capacity[i] / d) for k in members[j]), (n_v + j, 1.0), (y, -1.0)],
                0.0,
                np.inf,
            )
    for i in even:
        # In use iff it has a replica (with no demand, y is free and harmless).
        row([(i, 1.0), (y_index[i], -float(max(upper[i], 1.0)))], -np.inf, 0.0)
    for kind in sorted({v.accelerator for v in variants}):
        gpus = [
            (i, float(v.gpus_per_replica)) for i, v in enumerate(variants) if v.accelerator == kind
        ]
        row(gpus, -np.inf, float(inp.inventory.get(kind, 0)))

    trivial = lower.copy()
    trivial[n_v:] = upper[n_v:]  # u = 1 where there is demand, every y = 1
    r, c, value = zip(*entries, strict=True) if entries else ((), (), ())
    matrix = csr_array(
        (np.array(value, dtype=float), (np.array(r), np.array(c))), shape=(len(row_lo), size)
    )
    return _Program(
        cost=cost,
        integrality=integrality,
        lower=lower,
        upper=upper,
        rows=LinearConstraint(matrix, np.array(row_lo), np.array(row_hi)),
        unserved=unserved,
        n_variants=n_v,
        deadline_s=time.perf_counter() + inp.solve_time_limit_s,
        floor_s=inp.solve_time_limit_s / 100,
        trivial=trivial,
        in_use=y_index,
    )
