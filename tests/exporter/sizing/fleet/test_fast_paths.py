"""The shortcuts that make the fleet decision fast stay exact: the inventory bound that skips
the all-served stage, and the trimmed enumeration of one weighted model's counts."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from bench.fleet_speed import fleet
from exporter.sizing.fleet import milp
from exporter.sizing.fleet.evaluate import allocation, rank, within_limits
from exporter.sizing.fleet.greedy import greedy
from exporter.sizing.fleet.milp import gpus_short
from exporter.sizing.fleet.single import best_alone
from exporter.sizing.fleet.values import FleetInput, FleetModel, Routing, Variant
from tests.exporter.sizing.fleet.instances import exhaustive, random_instance


def test_the_gpu_bound_fires_only_when_no_plan_serves_all_demand() -> None:
    rng = random.Random(11)
    fired = 0
    for k in range(400):
        inp = random_instance(rng, limited=True)
        if gpus_short(inp):
            fired += 1
            best = exhaustive(inp)
            assert sum(best.unserved_rps.values()) > 0, (k, inp, best)
    assert fired >= 20  # the sample exercises the bound (36 of 400 with this seed)


def test_trimmed_counts_of_a_weighted_model_match_every_count_vector() -> None:
    """Maximums far above the demand: the enumeration stops one replica past what carries the
    demand alone, and still finds the cheapest plan of the full grid."""
    rng = random.Random(5)
    for k in range(60):
        variants = tuple(
            Variant(name=f"v{i}", model="m", accelerator=f"t{i}",
                    gpus_per_replica=rng.choice((1, 2)), price_per_gpu_hour=rng.uniform(0.5, 4.0),
                    capacity_rps=rng.uniform(0.3, 6.0),
                    min_replicas=rng.choice((0, 0, 1)), max_replicas=12)
            for i in range(3)
        )  # fmt: skip
        inp = FleetInput(
            models=(FleetModel(name="m", demand_rps=rng.uniform(0.5, 20.0),
                               routing=Routing.WEIGHTED),),
            variants=variants, inventory={f"t{i}": 1000 for i in range(3)},
        )  # fmt: skip
        plan = best_alone(inp, "m")
        assert plan is not None
        grid = itertools.product(*(range(v.min_replicas, v.max_replicas + 1) for v in variants))
        brute = min((allocation(inp, {v.name: n for v, n in zip(variants, counts, strict=True)})
                     for counts in grid), key=lambda p: rank(inp, p))  # fmt: skip
        assert rank(inp, plan)[0] == rank(inp, brute)[0], k
        assert abs(plan.cost_per_hour - brute.cost_per_hour) <= 1e-9 * brute.cost_per_hour, k


def test_a_skipped_stage_leaves_its_solver_time_to_the_later_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two higher priority levels the greedy plan serves entirely are skipped: the lowest
    level's stage gets about half the budget (it and the cost stage), not a fifth."""
    models = (
        FleetModel(name="hi", demand_rps=5.0, priority=2),
        FleetModel(name="mid", demand_rps=5.0, priority=1),
        FleetModel(name="lo", demand_rps=50.0, priority=0),
    )
    variants = tuple(
        Variant(name=f"{m.name}-{kind}", model=m.name, accelerator=kind, gpus_per_replica=1,
                price_per_gpu_hour=1.0 if kind == "a" else 1.5, capacity_rps=2.0,
                max_replicas=20)
        for m in models
        for kind in ("a", "b")
    )  # fmt: skip
    inp = FleetInput(models=models, variants=variants, inventory={"a": 10, "b": 10},
                     solve_time_limit_s=10.0)  # fmt: skip
    limits: list[float] = []
    solver = milp.milp

    def recorded(c: Any, **kwargs: Any) -> Any:
        limits.append(kwargs["options"]["time_limit"])
        return solver(c, **kwargs)

    monkeypatch.setattr(milp, "milp", recorded)
    plan = milp.solve_joint(inp, servable=False)
    assert plan.optimal and plan.unserved_rps["lo"] > 0 and plan.unserved_rps["hi"] == 0
    assert len(limits) == 2  # the lowest level's stage, then the cost stage
    assert limits[0] > 4.0  # half of what is left (was 10 s / (3 levels + 2) = 2 s)
    assert limits[1] > limits[0]  # the stage finished early: the cost stage gets the rest


def test_the_rounded_relaxation_beats_the_greedy_plan_on_a_large_short_fleet() -> None:
    """200 models on too few GPUs (bench/fleet_speed.py's case, whose stages run out of time):
    the relaxation rounded down and filled serves the higher levels as fully as the greedy
    plan and leaves much less of the lowest level unserved (755 against 973 req/s here)."""
    inp = fleet(random.Random(201), 200, short=True)
    rounded = milp._rounded(inp, milp._build(inp))
    quick = greedy(inp)
    assert rounded is not None and within_limits(inp, rounded.replicas)
    assert rank(inp, rounded)[:-2] == rank(inp, quick)[:-2] == (0.0, 0.0)
    assert rank(inp, rounded)[-2] < 0.85 * rank(inp, quick)[-2]
