"""Emulated replicas of several variants.

Emulated vLLM replicas of several variants of one model: the mixed-fleet simulator
(model/simulation/mixed.py) run in real time, each replica behind its own vLLM /metrics with
its own variant's KV capacity, each variant (one Kubernetes Deployment) on its own ports.

    fleet = MixedEmulatedFleet(
        [VariantSpec(name="h100", params=..., server=..., kv_capacity_tokens=426_788,
                     startup_delay_s=92.0), VariantSpec(name="l40s", ...)],
        rng=np.random.default_rng(0), arrivals=20.0, model_name="llama",
        replicas={"h100": 1, "l40s": 2}, routing=FleetRouting.LEAST_LOADED, base_port=9000,
    )
    with fleet:
        fleet.urls_by_variant()            # {"h100": [...], "l40s": [...]} of serving replicas
        fleet.set_variant_replicas("l40s", 3)
        fleet.set_weights({"h100": 12.0, "l40s": 8.0})   # the weighted rule's planned rates

Ports: with `base_port`, the j-th variant's replicas listen on base_port + PORTS_PER_VARIANT x j
+ i, i the lowest offset none of its serving replicas holds: one Deployment's pods share a range.
Everything else (time scale, ticks, threads, rejections) is `EmulatedFleet`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from exporter.testbed.emulator import MAX_JUMP_S, EmulatedFleet
from exporter.testbed.emulator_endpoint import ReplicaEndpoint
from exporter.testbed.emulator_metrics import ReplicaMetrics
from model.simulation.mixed import FleetRouting, MixedSimulator, VariantSpec
from model.simulation.replica import ReplicaState

PORTS_PER_VARIANT = 100


class MixedEmulatedFleet(EmulatedFleet):
    """Simulated replicas of several variants served in real time; see the module docstring."""

    def __init__(
        self,
        variants: Sequence[VariantSpec],
        *,
        replicas: Mapping[str, int],
        routing: FleetRouting = FleetRouting.LEAST_LOADED,
        weights: Mapping[str, float] | None = None,
        base_port: int | None = None,
        **kwargs: Any,
    ) -> None:
        """`kwargs`: EmulatedFleet's traffic, clock and host arguments (rng, arrivals, lengths,
        model_name, time_scale, max_model_len, clock, tick_s, host)."""
        if not variants:
            raise ValueError("`variants` must hold at least one variant, got none")
        for name, count in replicas.items():
            if count > PORTS_PER_VARIANT:
                raise ValueError(f"replicas.{name}: must be <= {PORTS_PER_VARIANT}, got {count}")
        first = variants[0]
        super().__init__(first.params, first.server, replicas=0, base_port=base_port,
                         kv_capacity_tokens=first.kv_capacity_tokens, **kwargs)
        self._sim: MixedSimulator = MixedSimulator(
            variants, routing=routing, replicas=replicas, weights=weights,
            max_jump_s=MAX_JUMP_S, record_iterations=True,
        )  # fmt: skip
        self._specs = {v.name: v for v in variants}
        self._order = {v.name: j for j, v in enumerate(variants)}
        self._ordinal: dict[int, int] = {}  # replica index -> its port offset in its variant

    def set_variant_replicas(self, name: str, count: int) -> None:
        """Scale one variant to `count` replicas from now."""
        if count > PORTS_PER_VARIANT:
            raise ValueError(f"replicas.{name}: must be <= {PORTS_PER_VARIANT}, got {count}")
        with self._lock:
            self._advance()
            self._sim.set_variant_replicas(name, count)
            self._refresh_replicas()

    def set_replicas(self, count: int) -> None:
        with self._lock:
            self._advance()
            self._sim.set_replicas(count)  # one-variant fleets only (raises otherwise)
            self._refresh_replicas()

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """The weighted rule's planned rate per variant, from now."""
        with self._lock:
            self._advance()
            self._sim.set_weights(weights)

    def urls_by_variant(self) -> dict[str, list[str]]:
        """/metrics URLs of the replicas serving now (ready or draining), per variant."""
        with self._lock:
            out: dict[str, list[str]] = {name: [] for name in self._specs}
            for index, served in sorted(self._served.items()):
                if served.serving and served.url:
                    out[self._sim.variant_of(index)].append(served.url)
            return out

    # -- overrides ------------------------------------------------------------------------------

    def _refresh_replicas(self) -> None:
        changed = False
        for status in self._sim.replica_status():
            variant = self._sim.variant_of(status.index)
            served = self._served_for(status.index)
            served.metrics.set_gauges(
                running=status.running,
                waiting=status.waiting,
                kv_usage_ratio=status.kv_tokens / self._specs[variant].kv_capacity_tokens,
            )
            if status.state in (ReplicaState.READY, ReplicaState.DRAINING) and served.url is None:
                port = 0
                if self._base_port is not None:
                    port = (self._base_port + PORTS_PER_VARIANT * self._order[variant]
                            + self._free_ordinal(status.index, variant))
                served.serve(self._host, port, f"emulated-{variant}-{status.index}")
                changed = True
            elif status.state is ReplicaState.REMOVED and served.serving:
                served.stop()
                changed = True
        if changed:
            self._urls = tuple(s.url for s in self._served.values() if s.serving and s.url)

    def _free_ordinal(self, index: int, variant: str) -> int:
        """The lowest port offset no serving replica of the variant holds."""
        taken = {
            self._ordinal[i] for i, s in self._served.items()
            if s.serving and i in self._ordinal and self._sim.variant_of(i) == variant
        }  # fmt: skip
        free = next(k for k in range(PORTS_PER_VARIANT + 1) if k not in taken)
        if free >= PORTS_PER_VARIANT:
            raise ValueError(f"replicas.{variant}: more than {PORTS_PER_VARIANT} serving at once")
        self._ordinal[index] = free
        return free

    def _served_for(self, index: int) -> ReplicaEndpoint:
        served = self._served.get(index)
        if served is None:
            variant = self._sim.variant_of(index)
            metrics = ReplicaMetrics(
                model_name=self._model_name,
                max_model_len=self._max_model_len,
                kv_capacity_tokens=self._specs[variant].kv_capacity_tokens,
                created_s=self.start_unix_s + self._sim.now_s,
            )
            served = self._served[index] = ReplicaEndpoint(metrics)
        return served
