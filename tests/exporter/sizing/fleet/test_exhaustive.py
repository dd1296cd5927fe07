"""The optimizer's plan against an exhaustive search over every count vector, on random
fleets: 1-3 models, 2-4 variants each, with and without inventory limits, both routing rules,
mixed priorities and untrusted variants."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np

from exporter.sizing.fleet import milp
from exporter.sizing.fleet.evaluate import no_worse, rank, within_limits
from exporter.sizing.fleet.greedy import greedy
from exporter.sizing.fleet.milp import solve, solve_joint
from exporter.sizing.fleet.values import Routing
from tests.exporter.sizing.fleet.instances import exhaustive, random_instance

INSTANCES = 1000


def test_the_plan_ranks_as_the_exhaustive_search_best_on_random_fleets() -> None:
    rng = random.Random(20261207)
    seen = {"limited_short": 0, "even": 0, "weighted": 0, "priorities": 0}
    for k in range(INSTANCES):
        inp = random_instance(rng, limited=k % 2 == 0)
        plan, best = solve(inp), exhaustive(inp)
        assert plan.optimal
        assert within_limits(inp, plan.replicas), (k, inp, plan)
        assert no_worse(inp, plan, best) and no_worse(inp, best, plan), (
            k, rank(inp, plan), rank(inp, best), inp,
        )  # fmt: skip
        seen["limited_short"] += any(u > 0 for u in best.unserved_rps.values())
        seen["even"] += any(m.routing is Routing.EVEN for m in inp.models)
        seen["weighted"] += any(m.routing is Routing.WEIGHTED for m in inp.models)
        seen["priorities"] += len({m.priority for m in inp.models}) > 1
    # The sample exercises every case the optimizer distinguishes.
    assert min(seen.values()) >= 100, seen


def test_the_joint_program_alone_ranks_as_the_exhaustive_search_best() -> None:
    """The MILP on every instance, also those the per-model path would have decided."""
    rng = random.Random(42)
    for k in range(300):
        inp = random_instance(rng, limited=k % 3 != 0)
        plan, best = solve_joint(inp), exhaustive(inp)
        assert plan.optimal
        assert within_limits(inp, plan.replicas), (k, inp, plan)
        assert no_worse(inp, plan, best) and no_worse(inp, best, plan), (
            k, rank(inp, plan), rank(inp, best), inp,
        )  # fmt: skip


def test_a_plan_out_of_time_is_feasible_and_no_worse_than_the_greedy_one() -> None:
    rng = random.Random(7)
    timed_out = 0
    for k in range(200):
        inp = replace(random_instance(rng, limited=True), solve_time_limit_s=1e-4)
        quick, plan = greedy(inp), solve(inp)
        timed_out += not plan.optimal
        assert within_limits(inp, quick.replicas) and within_limits(inp, plan.replicas), k
        assert no_worse(inp, plan, quick), (k, rank(inp, plan), rank(inp, quick))
        assert no_worse(inp, exhaustive(inp), plan)
    assert timed_out >= 50  # the time limit did cut the solver short


def test_the_greedy_plan_is_a_point_of_the_program() -> None:
    """The greedy plan stands in for a stage that is skipped or out of time: it must meet
    every row and bound of the program."""
    rng = random.Random(3)
    for k in range(300):
        inp = random_instance(rng, limited=True)
        program = milp._build(inp)
        x = milp._point(inp, program, greedy(inp))
        rows = program.rows.A @ x
        assert np.all(rows >= program.rows.lb - 1e-6) and np.all(rows <= program.rows.ub + 1e-6), k
        assert np.all(x >= program.lower) and np.all(x <= program.upper), k
