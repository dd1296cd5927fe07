"""A fleet of unequal replicas serving one model: several variants (accelerator types, tensor
parallel sizes), each with its own (alpha, beta, gamma), B and M, KV capacity and startup
delay, behind one router.

Routing, the three rules a gateway in front of vLLM applies:

- `even`: round robin over every ready replica, whatever its variant (one Kubernetes Service);
- `least_loaded`: the ready replica with the fewest running + waiting requests, the lowest
  index on ties (vLLM's production router and llm-d's gateway approximate this);
- `weighted`: a variant is chosen by smooth weighted round robin on the rate the plan gives it
  (deterministic: over any run of picks each variant's share is within one pick of its weight's
  share), then round robin among that variant's ready replicas. A variant with weight 0 or no
  ready replica gets nothing; with no weighted variant ready, every ready replica is eligible.

A request longer than the KV capacity of the replica it is routed to is rejected there, as
vLLM rejects a prompt beyond its max_model_len. Everything else (event order, draining,
admission limits) is the single-variant simulator's (`simulator.py`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from model.queueing.params import ServerConfig, ServiceParams
from model.queueing.validation import require_int_at_least, require_non_negative
from model.simulation.replica import Replica, ReplicaState
from model.simulation.simulator import Priority, ReplicaReady, Router, Simulator


class FleetRouting(StrEnum):
    """How a mixed fleet's gateway picks a ready replica; values are configuration values."""

    EVEN = "even"
    LEAST_LOADED = "least_loaded"
    WEIGHTED = "weighted"


@dataclass(frozen=True, slots=True, kw_only=True)
class VariantSpec:
    """What one variant's replicas are: their true parameters and vLLM settings."""

    name: str
    params: ServiceParams
    server: ServerConfig
    kv_capacity_tokens: int
    startup_delay_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("`name` must be a non-empty string, got ''")
        require_int_at_least(f"{self.name}.kv_capacity_tokens", self.kv_capacity_tokens, 1)
        require_non_negative(f"{self.name}.startup_delay_s", self.startup_delay_s)


class MixedSimulator(Simulator):
    """A simulated fleet of several variants of one model; times in s."""

    def __init__(
        self,
        variants: Sequence[VariantSpec],
        *,
        routing: FleetRouting = FleetRouting.LEAST_LOADED,
        replicas: Mapping[str, int] | None = None,
        weights: Mapping[str, float] | None = None,
        max_jump_s: float = math.inf,
        record_iterations: bool = False,
    ) -> None:
        """`replicas`: ready at time 0, per variant name (default none); `weights`: the
        weighted rule's rate per variant (default: equal)."""
        if not variants:
            raise ValueError("`variants` must hold at least one variant, got none")
        names = [v.name for v in variants]
        if len(set(names)) != len(names):
            raise ValueError(f"variant names must be unique, got {names}")
        self._variants = tuple(variants)
        self._index = {v.name: k for k, v in enumerate(variants)}
        self._routing = FleetRouting(routing)
        self._variant_of: list[int] = []
        self._making = 0  # the variant `_new_replica` builds
        self._credit = [0.0] * len(variants)
        self._weights = [1.0] * len(variants)
        self._within_rr = [0] * len(variants)
        base = Router.LEAST_LOADED if self._routing is FleetRouting.LEAST_LOADED else (
            Router.ROUND_ROBIN)
        # The base simulator's own KV check is off (None): the capacity is the routed replica's.
        super().__init__(
            variants[0].params, variants[0].server, replicas=0, router=base,
            kv_capacity_tokens=None, max_jump_s=max_jump_s, record_iterations=record_iterations,
        )  # fmt: skip
        if weights is not None:
            self.set_weights(weights)
        for name, count in (replicas or {}).items():
            self._variant_index(name)
            for _ in range(require_int_at_least(f"replicas.{name}", count, 0)):
                self._making = self._index[name]
                self._new_replica().state = ReplicaState.READY

    @property
    def variants(self) -> tuple[VariantSpec, ...]:
        return self._variants

    @property
    def routing(self) -> FleetRouting:
        return self._routing

    def variant_of(self, replica: int) -> str:
        """The variant name of replica index `replica`."""
        return self._variants[self._variant_of[replica]].name

    def replica_variants(self) -> list[str]:
        """The variant of every replica ever created, by index."""
        return [self._variants[k].name for k in self._variant_of]

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """The weighted rule's rate per variant from now (a variant not named gets 0)."""
        values = [0.0] * len(self._variants)
        for name, w in weights.items():
            if not (math.isfinite(w) and w >= 0):
                raise ValueError(f"weights.{name}: must be a number >= 0, got {w}")
            values[self._variant_index(name)] = float(w)
        self._weights = values
        self._credit = [0.0] * len(values)

    def set_replicas(self, count: int) -> None:
        """Scale a one-variant fleet (the single-variant simulator's interface)."""
        if len(self._variants) != 1:
            raise ValueError("a mixed fleet scales per variant: use set_variant_replicas")
        self.set_variant_replicas(self._variants[0].name, count)

    def set_variant_replicas(self, name: str, count: int) -> None:
        """Scale one variant to `count` replicas now: add (ready after its startup delay) or
        drain (those still starting first, newest first)."""
        k = self._variant_index(name)
        count = require_int_at_least(f"replicas.{name}", count, 0)
        live = (ReplicaState.STARTING, ReplicaState.READY)
        active = [r for r in self._replicas if r.state in live and self._variant_of[r.index] == k]
        if count > len(active):
            for _ in range(count - len(active)):
                self._making = k
                replica = self._new_replica()
                self._push(self._now_s + self._variants[k].startup_delay_s,
                           Priority.REPLICA_READY, ReplicaReady(replica.index))
            return
        self._retire(active, len(active) - count)

    def set_counts(self, counts: Mapping[str, int]) -> None:
        """Scale every named variant (the others keep their count)."""
        for name, count in counts.items():
            self.set_variant_replicas(name, count)

    def counts(self, states: tuple[ReplicaState, ...] = (ReplicaState.STARTING,
                                                         ReplicaState.READY)) -> dict[str, int]:
        """Replicas per variant in `states` (default: asked for, starting or ready)."""
        out = {v.name: 0 for v in self._variants}
        for r in self._replicas:
            if r.state in states:
                out[self._variants[self._variant_of[r.index]].name] += 1
        return out

    # -- overrides of the single-variant simulator ----------------------------------------------

    def _new_replica(self) -> Replica:
        spec = self._variants[self._making]
        replica = Replica(
            len(self._replicas), spec.params, spec.server, self._requests,
            kv_capacity_tokens=spec.kv_capacity_tokens, max_jump_s=self._max_jump_s,
            record=self._record,
        )  # fmt: skip
        self._replicas.append(replica)
        self._variant_of.append(self._making)
        return replica

    def _dispatch(self, req: int, ready: list[Replica]) -> None:
        replica = self._pick(ready)
        t = self._requests
        spec = self._variants[self._variant_of[replica.index]]
        if t.input_tokens[req] + t.output_tokens[req] > spec.kv_capacity_tokens:
            t.replica[req] = replica.index
            t.rejected[req] = True
            return
        self._enqueue(req, replica, spec.server.max_queue_size)

    def _pick(self, ready: list[Replica]) -> Replica:
        if self._routing is FleetRouting.LEAST_LOADED:
            return min(ready, key=lambda r: (r.load, r.index))
        if self._routing is FleetRouting.EVEN:
            replica = ready[self._rr % len(ready)]
            self._rr += 1
            return replica
        by_variant: dict[int, list[Replica]] = {}
        for r in ready:
            by_variant.setdefault(self._variant_of[r.index], []).append(r)
        eligible = [k for k in by_variant if self._weights[k] > 0]
        if not eligible:
            replica = ready[self._rr % len(ready)]
            self._rr += 1
            return replica
        total = sum(self._weights[k] for k in eligible)
        for k in eligible:
            self._credit[k] += self._weights[k]
        chosen = max(eligible, key=lambda k: (self._credit[k], -k))
        self._credit[chosen] -= total
        group = by_variant[chosen]
        replica = group[self._within_rr[chosen] % len(group)]
        self._within_rr[chosen] += 1
        return replica

    def _variant_index(self, name: str) -> int:
        if name not in self._index:
            raise ValueError(f"no variant named {name!r} (the fleet has "
                             f"{', '.join(v.name for v in self._variants)})")
        return self._index[name]
