"""The fleet policies a fleet replay compares.

- `ours`: the fleet optimizer (exporter/sizing/fleet, `FleetPlanner`) on per-variant estimates:
  one tuner per variant (the single-deployment tuner, `model.Tuner`), fed each window with its
  own replicas' mean rate, lengths, TTFT and ITL as the simulator measured them (a perfect
  collector: per-variant online calibration through the daemon is not wired yet); a variant
  whose tuner has not fitted is untrusted and counted at the scaling rule's prior.
- `oracle`: the same optimizer, the same demand, the true parameters.
- `best_single`: ours restricted to one variant per model, the one cheapest over the trace.
- `oracle_foresight` (reported, not scored): the oracle planning for the highest rate of the
  windows up to one startup delay ahead (plus the margin): what knowing the future buys.
- `greedy_kv`: cheapest KV-token capacity first (exporter/replay/fleet_baselines.py), behind
  the HPA's default scale-down stabilization (300 s), as the autoscaler that applied it ran.

Every policy plans for the same demand: the highest rate of the last two windows, plus the
setup's margin. Capacities are `max_rate_for_slo` on the mean targets with the batch the KV
cache holds, cached on rounded parameters and workload.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from exporter.config.values import DEFAULT_STABILIZATION_S
from exporter.replay.fleet_baselines import Offer, greedy_kv
from exporter.replay.fleet_setup import FleetSetup, FleetVariant
from exporter.sizing.fleet.plan import FleetPlanner
from exporter.sizing.fleet.values import FleetInput, FleetModel, Variant
from exporter.testbed.variant_truths import ARCHITECTURES, scaling_rule
from model.calibration.observation import Observation
from model.calibration.prior import CentreSource, prior_around
from model.calibration.trust import is_trusted
from model.calibration.tuner import Tuner
from model.queueing.kv_limit import kv_batch_limit
from model.queueing.params import ServerConfig, ServiceParams, Workload
from model.queueing.sizing import max_rate_for_slo
from model.queueing.variant import ModelOptions

_WORKLOAD_STEP = 0.05  # workloads are rounded to 5 % steps (log scale) before sizing


@dataclass(frozen=True, slots=True, kw_only=True)
class VariantWindow:
    """One variant over the window just ended."""

    asked: int  # replicas asked for (starting + ready)
    ready: int
    observation: Observation | None  # None: too few requests on it to observe


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelWindow:
    """One model over the window just ended, as every policy reads it."""

    demand_rps: float  # what to plan for (margin and look-back applied)
    workload: Workload  # mean lengths so far
    input_cv: float = 0.0  # of the lengths so far
    output_cv: float = 0.0
    ahead_rps: float | None = None  # foresight only: the demand one startup delay ahead
    in_flight: int  # requests arrived and not finished at the window's end
    variants: Mapping[str, VariantWindow]


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetDecision:
    counts: Mapping[str, int]  # replicas per variant from now
    weights: Mapping[str, float]  # the weighted gateway's rate per variant
    unserved_rps: Mapping[str, float] = field(default_factory=dict)
    reason: str = ""


class FleetPolicy(Protocol):
    name: str

    def decide(self, now_s: float, windows: Mapping[str, ModelWindow]) -> FleetDecision: ...


class Capacities:
    """One replica's SLO capacity (req/s), cached on rounded inputs."""

    def __init__(self, setup: FleetSetup) -> None:
        self._setup = setup
        self._cache: dict[tuple[object, ...], float] = {}
        self._targets = {m.name: (m.ttft_ms, m.itl_ms) for m in setup.models}

    def of(self, v: FleetVariant, params: ServiceParams, workload: Workload,
           input_cv: float = 0.0, output_cv: float = 0.0) -> float:
        w = Workload(_rounded(workload.avg_input_tokens), _rounded(workload.avg_output_tokens))
        p = tuple(float(f"{x:.3g}") for x in params.as_tuple())
        cvs = (round(input_cv, 1), round(output_cv, 1))
        key = (v.name, p, w.avg_input_tokens, w.avg_output_tokens, cvs)
        if key not in self._cache:
            batch = kv_batch_limit(v.truth.kv_capacity_tokens, w, v.server.max_batch_size,
                                   output_length_cv=cvs[1])
            server = ServerConfig(batch, v.server.max_num_batched_tokens)
            ttft, itl = self._targets[v.model]
            options = ModelOptions(input_length_cv=cvs[0], output_length_cv=cvs[1],
                                   architecture=ARCHITECTURES[v.truth.model])
            self._cache[key] = max_rate_for_slo(ServiceParams(*p), server, w, ttft, itl,
                                                options=options).rate_rps
        return self._cache[key]


def _rounded(tokens: float) -> float:
    step = math.log1p(_WORKLOAD_STEP)
    return float(math.exp(round(math.log(max(tokens, 1.0)) / step) * step))


class Estimates(Protocol):
    def update(self, windows: Mapping[str, ModelWindow]) -> None: ...

    def params(self, v: FleetVariant) -> tuple[ServiceParams, bool]:
        """The estimate and whether it is trusted."""
        ...


class TrueEstimates:
    """The oracle's: the truth, trusted."""

    def update(self, windows: Mapping[str, ModelWindow]) -> None:
        return None

    def params(self, v: FleetVariant) -> tuple[ServiceParams, bool]:
        return v.truth.params, True


@dataclass(frozen=True, slots=True, kw_only=True)
class TrustRecord:
    """When a variant's first replica was ready and when its tuner was first trusted (the
    calibration confidence at or above the trusted threshold, `is_trusted`), both window ends
    (s); and then, at the model's workload, the capacity per replica of its prior (the
    scaling rule's transfer) over its own estimate's and over the truth's, less 1."""

    ready_s: float
    trusted_s: float | None = None
    prior_vs_own: float | None = None
    prior_vs_truth: float | None = None


class TunerEstimates:
    """Ours: one single-deployment tuner per variant, its prior the scaling rule's transfer."""

    def __init__(self, setup: FleetSetup) -> None:
        self._rule = {v.name: scaling_rule(v.truth.model, v.truth.accelerator, v.gpus)
                      for v in setup.variants}
        self.tuners = {
            v.name: Tuner(v.server, prior=prior_around(self._rule[v.name], CentreSource.PHYSICAL))
            for v in setup.variants
        }

    def update(self, windows: Mapping[str, ModelWindow]) -> None:
        for window in windows.values():
            for name, seen in window.variants.items():
                if seen.observation is not None:
                    self.tuners[name].update(seen.observation)

    def params(self, v: FleetVariant) -> tuple[ServiceParams, bool]:
        tuner = self.tuners[v.name]
        if tuner.fit_count > 0 and tuner.params is not None:
            return tuner.params, True
        return self._rule[v.name], False

    def prior(self, v: FleetVariant) -> ServiceParams:
        return self._rule[v.name]


class PlannerPolicy:
    """The fleet optimizer on some estimates, over all or some variants."""

    def __init__(self, name: str, setup: FleetSetup, estimates: Estimates,
                 allowed: set[str] | None = None, *, foresight: bool = False) -> None:
        """`foresight`: plan for `ahead_rps` (the demand one startup delay ahead) instead."""
        self.name = name
        self.foresight = foresight
        self.setup = setup
        self.estimates = estimates
        self.allowed = allowed
        self.capacities = Capacities(setup)
        self.planner = FleetPlanner()
        self.untrusted_windows = 0
        self.trust: dict[str, TrustRecord] = {}

    def _note_trust(self, now_s: float, windows: Mapping[str, ModelWindow]) -> None:
        """Each variant's `TrustRecord` (ours' tuners only)."""
        est = self.estimates
        if not isinstance(est, TunerEstimates):
            return
        for m in self.setup.models:
            seen = windows[m.name]
            for v in m.variants:
                record = self.trust.get(v.name)
                if record is None:
                    if seen.variants[v.name].ready > 0:
                        self.trust[v.name] = TrustRecord(ready_s=now_s)
                    continue
                tuner = est.tuners[v.name]
                if record.trusted_s is not None or tuner.params is None:
                    continue
                if not is_trusted(tuner.estimate().confidence):
                    continue
                prior, own, truth = (
                    self.capacities.of(v, p, seen.workload, seen.input_cv, seen.output_cv)
                    for p in (est.prior(v), tuner.params, v.truth.params)
                )
                self.trust[v.name] = replace(
                    record, trusted_s=now_s,
                    prior_vs_own=prior / own - 1.0 if own > 0 else None,
                    prior_vs_truth=prior / truth - 1.0 if truth > 0 else None,
                )  # fmt: skip

    def decide(self, now_s: float, windows: Mapping[str, ModelWindow]) -> FleetDecision:
        self.estimates.update(windows)
        self._note_trust(now_s, windows)
        variants: list[Variant] = []
        caps: dict[str, float] = {}
        for m in self.setup.models:
            for v in m.variants:
                params, trusted = self.estimates.params(v)
                seen_m = windows[m.name]
                cap = self.capacities.of(v, params, seen_m.workload, seen_m.input_cv,
                                         seen_m.output_cv)
                caps[v.name] = cap
                self.untrusted_windows += not trusted
                off = self.allowed is not None and v.name not in self.allowed
                seen = windows[m.name].variants[v.name]
                variants.append(Variant(
                    name=v.name, model=m.name, accelerator=v.accelerator,
                    gpus_per_replica=v.gpus,
                    price_per_gpu_hour=self.setup.prices[v.accelerator], capacity_rps=cap,
                    min_replicas=0 if off else v.min_replicas,
                    max_replicas=0 if off else v.max_replicas,
                    current_replicas=seen.asked, ready_replicas=seen.ready, trusted=trusted,
                    prior_capacity_rps=None if trusted else cap,
                    startup_delay_s=v.truth.startup_delay_s,
                ))  # fmt: skip
        inp = FleetInput(
            models=tuple(FleetModel(name=m.name, demand_rps=self._demand(windows[m.name]),
                                    priority=m.priority, routing=m.routing)
                         for m in self.setup.models),
            variants=tuple(variants), inventory=self.setup.inventory,
            switch_saving=self.setup.switch_saving,
        )  # fmt: skip
        plan = self.planner.decide(now_s, inp)
        desired = dict(plan.desired)
        return FleetDecision(
            counts=desired,
            weights={name: desired[name] * caps[name] for name in desired},
            unserved_rps=plan.unserved_rps,
            reason=plan.reason.value,
        )


    def _demand(self, window: ModelWindow) -> float:
        if self.foresight and window.ahead_rps is not None:
            return window.ahead_rps
        return window.demand_rps


class GreedyKvPolicy:
    """Cheapest KV-token capacity first; a model needs the KV tokens its requests in flight
    hold (mean prompt plus half the mean output each)."""

    def __init__(self, setup: FleetSetup, name: str = "greedy_kv",
                 stabilization_s: float = DEFAULT_STABILIZATION_S) -> None:
        self.name = name
        self.setup = setup
        self.stabilization_s = stabilization_s
        self._history: list[tuple[float, dict[str, int]]] = []
        self.offers = [
            Offer(name=v.name, model=v.model, accelerator=v.accelerator, gpus=v.gpus,
                  cost_per_replica_hour=setup.cost_per_replica_hour(v),
                  kv_capacity_tokens=v.truth.kv_capacity_tokens, min_replicas=v.min_replicas,
                  max_replicas=v.max_replicas)
            for v in setup.variants
        ]  # fmt: skip

    def decide(self, now_s: float, windows: Mapping[str, ModelWindow]) -> FleetDecision:
        demand = {}
        for name, w in windows.items():
            per_request = w.workload.avg_input_tokens + w.workload.avg_output_tokens / 2.0
            # At least one replica while there is traffic: an idle window holds no KV.
            floor = 1.0 if w.demand_rps > 0 else 0.0
            demand[name] = max(w.in_flight * per_request, floor)
        counts = greedy_kv(demand, self.offers, self.setup.inventory,
                           {m.name: m.priority for m in self.setup.models})
        held = self._stabilized(now_s, counts)
        return FleetDecision(counts=held, weights={k: float(n) for k, n in held.items()},
                             reason="kv_tokens")

    def _stabilized(self, now_s: float, counts: dict[str, int]) -> dict[str, int]:
        """The HPA's scale-down stabilization per variant (the highest count proposed within
        the window), dropped back to the proposal where it would exceed the inventory."""
        self._history = [(t, c) for t, c in self._history if t > now_s - self.stabilization_s]
        self._history.append((now_s, counts))
        held = {k: max(c[k] for _, c in self._history) for k in counts}
        used: dict[str, int] = {}
        for o in self.offers:
            used[o.accelerator] = used.get(o.accelerator, 0) + held[o.name] * o.gpus
        for o in self.offers:
            if used[o.accelerator] > self.setup.inventory.get(o.accelerator, 0):
                used[o.accelerator] -= (held[o.name] - counts[o.name]) * o.gpus
                held[o.name] = counts[o.name]
        return held
