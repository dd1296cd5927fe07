"""Random fleet instances and the exhaustive search the optimizer is checked against."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

from exporter.sizing.fleet.evaluate import allocation, rank, within_limits
from exporter.sizing.fleet.values import Allocation, FleetInput, FleetModel, Routing, Variant

TYPES = ("h100", "a100", "l40s")
PRICES = {"h100": 4.0, "a100": 2.5, "l40s": 1.2}
# Count vectors the exhaustive search visits at most: larger maximums are trimmed.
SEARCH_SPACE = 300


def random_instance(rng: random.Random, *, limited: bool) -> FleetInput:
    """1-3 models with 2-4 variants each, small maximums so exhaustive search stays cheap."""
    models = []
    variants = []
    n_models = rng.randint(1, 3)
    for j in range(n_models):
        name = f"m{j}"
        models.append(
            FleetModel(
                name=name,
                demand_rps=round(rng.uniform(0.0, 12.0), 3) if rng.random() > 0.05 else 0.0,
                priority=rng.randint(0, 2),
                routing=rng.choice(list(Routing)),
            )
        )
        per_model = rng.randint(2, 4)
        for k in range(per_model):
            kind = rng.choice(TYPES)
            low = rng.choice((0, 0, 0, 1))
            variants.append(
                Variant(
                    name=f"{name}-v{k}",
                    model=name,
                    accelerator=kind,
                    gpus_per_replica=rng.choice((1, 1, 2)),
                    price_per_gpu_hour=PRICES[kind] * rng.uniform(0.8, 1.2),
                    capacity_rps=round(rng.uniform(0.5, 5.0), 3),
                    min_replicas=low,
                    max_replicas=rng.randint(max(low, 1), 4),
                    trusted=rng.random() > 0.2,
                    prior_capacity_rps=round(rng.uniform(0.5, 5.0), 3),
                )
            )
    variants = _trimmed(variants)
    floor: dict[str, int] = {}
    for v in variants:
        floor[v.accelerator] = floor.get(v.accelerator, 0) + v.min_replicas * v.gpus_per_replica
    if limited:
        inventory = {kind: floor.get(kind, 0) + rng.randint(0, 5) for kind in TYPES}
    else:
        inventory = {kind: 1000 for kind in TYPES}
    return FleetInput(models=tuple(models), variants=tuple(variants), inventory=inventory)


def _trimmed(variants: list[Variant]) -> list[Variant]:
    """The widest count ranges narrowed until the search space is at most SEARCH_SPACE."""
    while math.prod(v.max_replicas - v.min_replicas + 1 for v in variants) > SEARCH_SPACE:
        widest = max(
            range(len(variants)), key=lambda i: variants[i].max_replicas - variants[i].min_replicas
        )
        v = variants[widest]
        variants[widest] = replace(v, max_replicas=v.max_replicas - 1)
    return variants


def exhaustive(inp: FleetInput) -> Allocation:
    """The best plan over every count vector within min/max and the inventory."""
    ranges = [range(v.min_replicas, v.max_replicas + 1) for v in inp.variants]
    best: Allocation | None = None
    best_rank: tuple[float, ...] | None = None
    for counts in itertools.product(*ranges):
        replicas = {v.name: n for v, n in zip(inp.variants, counts, strict=True)}
        if not within_limits(inp, replicas):
            continue
        plan = allocation(inp, replicas)
        key = rank(inp, plan)
        if best_rank is None or key < best_rank:
            best, best_rank = plan, key
    assert best is not None  # the minimums fit by construction
    return best
