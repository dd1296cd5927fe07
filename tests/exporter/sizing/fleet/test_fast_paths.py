"""The shortcuts that make the fleet decision fast stay exact: the inventory bound that skips
the all-served stage, and the trimmed enumeration of one weighted model's counts."""

from __future__ import annotations

import itertools
import random

from exporter.sizing.fleet.evaluate import allocation, rank
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
