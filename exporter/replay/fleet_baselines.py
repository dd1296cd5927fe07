"""The fleet policies ours is compared with, as pure rules.

- `greedy_kv`: the deprecated workload-variant autoscaler's rule, cheapest capacity first on
  KV-cache tokens: a model needs the KV tokens its requests hold (over a target fill), each
  variant offers its KV capacity per replica, and variants are filled in order of price per KV
  token, the highest-priority model first, within each variant's max and the inventory.
- `cheapest_single`: the one variant per model that is cheapest over a whole trace (hindsight):
  each window's demand carried at that variant's capacity per replica, within its max and the
  inventory; a variant that cannot carry some window's demand there ranks after every one that
  can (then by the demand it leaves uncarried). Models choose in priority order, each within
  the GPUs the models before it take at their peak.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from model.queueing.sizing import CEIL_SLACK

DEFAULT_KV_FILL = 0.8  # the KV-cache usage a replica is sized to


@dataclass(frozen=True, slots=True, kw_only=True)
class Offer:
    """One variant as the baselines see it."""

    name: str
    model: str
    accelerator: str
    gpus: int
    cost_per_replica_hour: float
    kv_capacity_tokens: float
    capacity_rps: float = 0.0  # one replica's SLO capacity (cheapest_single only)
    min_replicas: int = 0
    max_replicas: int = 10


def greedy_kv(
    demand_kv_tokens: Mapping[str, float],
    offers: Sequence[Offer],
    inventory: Mapping[str, int],
    priorities: Mapping[str, int],
    fill: float = DEFAULT_KV_FILL,
) -> dict[str, int]:
    """Replicas per variant (see the module docstring); each variant at least its minimum."""
    counts = {o.name: o.min_replicas for o in offers}
    free = dict(inventory)
    for o in offers:
        free[o.accelerator] = free.get(o.accelerator, 0) - o.min_replicas * o.gpus
    order = sorted(demand_kv_tokens, key=lambda m: (-priorities.get(m, 0), m))
    for model in order:
        own = [o for o in offers if o.model == model and o.kv_capacity_tokens > 0]
        need = demand_kv_tokens[model] - sum(counts[o.name] * o.kv_capacity_tokens * fill
                                             for o in own)
        for o in sorted(own, key=lambda o: (o.cost_per_replica_hour / o.kv_capacity_tokens,
                                            o.name)):
            if need <= 0:
                break
            room = min(o.max_replicas - counts[o.name], max(free[o.accelerator], 0) // o.gpus)
            take = min(math.ceil(need / (o.kv_capacity_tokens * fill) - CEIL_SLACK), room)
            if take <= 0:
                continue
            counts[o.name] += take
            free[o.accelerator] -= take * o.gpus
            need -= take * o.kv_capacity_tokens * fill
    return counts


def single_cost(demand_rps: Sequence[float], offer: Offer, inventory: Mapping[str, int],
                window_s: float) -> tuple[float, float]:
    """(demand left uncarried, req; cost) of serving `demand_rps` per window with `offer`
    alone."""
    fits = min(offer.max_replicas, inventory.get(offer.accelerator, 0) // offer.gpus)
    short = 0.0
    cost = 0.0
    for rate in demand_rps:
        want = (max(math.ceil(rate / offer.capacity_rps - CEIL_SLACK), offer.min_replicas)
                if offer.capacity_rps > 0 else fits + 1)
        n = min(want, fits)
        short += max(rate - n * offer.capacity_rps, 0.0) * window_s
        cost += n * offer.cost_per_replica_hour * window_s / 3600.0
    return short, cost


def single_peak(demand_rps: Sequence[float], offer: Offer, inventory: Mapping[str, int]) -> int:
    """The most replicas `offer` runs in any window serving `demand_rps` alone."""
    fits = min(offer.max_replicas, inventory.get(offer.accelerator, 0) // offer.gpus)
    if offer.capacity_rps <= 0:
        return min(offer.min_replicas, fits)
    want = max((math.ceil(r / offer.capacity_rps - CEIL_SLACK) for r in demand_rps), default=0)
    return min(max(want, offer.min_replicas), fits)


def cheapest_single(demand_rps: Sequence[float], offers: Sequence[Offer],
                    inventory: Mapping[str, int], window_s: float) -> str:
    """The name of the offer that serves the demand at the least cost (module docstring)."""
    if not offers:
        raise ValueError("`offers` must hold at least one variant, got none")

    def key(o: Offer) -> tuple[bool, float, float, str]:
        short, cost = single_cost(demand_rps, o, inventory, window_s)
        return (short > 1e-9, short, cost, o.name)

    return min(offers, key=key).name
