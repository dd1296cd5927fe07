"""One model's best counts with no inventory limit, without a solver: the piece the fleet
optimizer assembles when the models' plans fit the inventory together.

`weighted`: every count vector of all variants but the widest is enumerated (numpy), the
widest's count is the fewest that carry the rest of the demand. `even`: for each set of
variants in use, the fewest replicas that carry the demand at the set's smallest capacity,
the cheapest replicas first. Both exact; None when the enumeration would be too large.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np

from exporter.sizing.fleet.evaluate import allocation, rank
from exporter.sizing.fleet.values import Allocation, FleetInput, Routing, Variant
from model.queueing.sizing import CEIL_SLACK

# Count vectors enumerated at most for a weighted model (numpy arrays of this length).
MAX_GRID = 400_000


def best_alone(inp: FleetInput, model: str) -> Allocation | None:
    """The model's lexicographically best plan ignoring the inventory, over its own variants
    only; None when too large to enumerate."""
    inp = only(inp, model)
    own = list(inp.variants)
    m = inp.models[0]
    caps = [v.sizing_capacity_rps(inp.untrusted_margin) for v in own]
    if m.routing is Routing.EVEN:
        candidates = _even(own, caps, m.demand_rps)
    else:
        found = _weighted(own, caps, m.demand_rps)
        if found is None:
            return None
        candidates = [found]
    names = [v.name for v in own]
    plans = [allocation(inp, dict(zip(names, c, strict=True))) for c in candidates]
    return min(plans, key=lambda p: rank(inp, p))


def only(inp: FleetInput, model: str) -> FleetInput:
    """The fleet input of one model and its variants alone."""
    variants = inp.own(model)
    return replace(inp, models=(inp.model(model),), variants=variants)


def _weighted(own: list[Variant], caps: list[float], demand: float) -> list[int] | None:
    low = [v.min_replicas for v in own]
    high = [v.max_replicas for v in own]
    if demand <= 0:
        return low
    top = sum(c * h for c, h in zip(caps, high, strict=True))
    if top + CEIL_SLACK * max(caps) < demand:
        # Short at every count: all that serve at their maximum carry the most.
        return [h if c > 0 else lo for c, h, lo in zip(caps, high, low, strict=True)]
    # More replicas of one variant than carry the demand alone (one above its own ceil, so
    # the rounding slack cannot leave a shortfall) only add cost: any plan above that is
    # matched by one at it, the last variant at its minimum. Exact, and the grid shrinks
    # from up to (max + 1)^3 to about (demand / capacity)^3 vectors.
    high = [
        min(h, max(lo, math.ceil(demand / c - CEIL_SLACK) + 1)) if c > 0 else lo
        for c, h, lo in zip(caps, high, low, strict=True)
    ]
    last = max(range(len(own)), key=lambda i: (high[i] - low[i]) if caps[i] > 0 else -1)
    rest = [i for i in range(len(own)) if i != last]
    if math.prod(high[i] - low[i] + 1 for i in rest) > MAX_GRID:
        return None
    axes = np.meshgrid(*(np.arange(low[i], high[i] + 1) for i in rest), indexing="ij")
    grid = [a.ravel() for a in axes] if rest else []
    size = grid[0].size if grid else 1
    carried = np.zeros(size)
    cost = np.zeros(size)
    for i, counts in zip(rest, grid, strict=True):
        carried += caps[i] * counts
        cost += own[i].cost_per_replica_hour * counts
    need = np.ceil((demand - carried) / caps[last] - CEIL_SLACK)
    n_last = np.maximum(need, low[last])
    ok = n_last <= high[last]
    total = np.where(ok, cost + own[last].cost_per_replica_hour * n_last, np.inf)
    k = int(np.argmin(total))
    chosen = [0] * len(own)
    for i, axis in zip(rest, grid, strict=True):
        chosen[i] = int(axis[k])
    chosen[last] = int(n_last[k])
    return chosen


def _even(own: list[Variant], caps: list[float], demand: float) -> list[list[int]]:
    """The best count vector of each set of variants in use."""
    forced = {i for i, v in enumerate(own) if v.min_replicas > 0}
    out: list[list[int]] = []
    for size in range(len(own) + 1):
        for chosen in itertools.combinations(range(len(own)), size):
            used = set(chosen)
            if not forced <= used:
                continue
            low = [
                max(own[i].min_replicas, 1) if i in used else own[i].min_replicas
                for i in range(len(own))
            ]
            high = [
                own[i].max_replicas if i in used else own[i].min_replicas for i in range(len(own))
            ]
            smallest = min((caps[i] for i in used), default=0.0)
            floor, top = sum(low), sum(high)
            if smallest > 0:
                wanted = max(math.ceil(demand / smallest - CEIL_SLACK), floor)
            else:
                wanted = floor
            counts = list(low)
            extra = min(wanted, top) - floor
            for i in sorted(used, key=lambda i: (own[i].cost_per_replica_hour, i)):
                step = min(extra, high[i] - counts[i])
                counts[i] += step
                extra -= step
            out.append(counts)
    return out
