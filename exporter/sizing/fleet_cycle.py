"""The fleet plan in the sizing cycle: the variants of each configured model (each its own
deployment, tuner and recommender) sized together by the least-cost plan (exporter/sizing/fleet).

Before the variants decide, a variant whose tuner has no estimate of its own takes a prior
transferred from a trusted sibling of the same model (model.calibration.prior.transferred: beta
by peak FLOP/s, alpha and gamma by memory bandwidth, GPU counts folded in); with none trusted it
keeps its physical (or generic) prior. It stays untrusted until its own pods calibrate it; then
the transferred prior's capacity error against its own estimate is kept, once.

After each variant decided alone, the plan replaces the counts: each variant's capacity is its
decision's SLO capacity per replica (else the model at its parameters), the model's demand the
sum of its variants' sizing rates, the inventory this cycle's. A model any of whose variants
read nothing this cycle keeps its last plan: its demand is not known.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from exporter.config.values import DeploymentConfig, FleetConfig, FleetModelConfig
from exporter.sizing.cycle import DeploymentCycle, Estimate, Sizer
from exporter.sizing.fleet.evaluate import cost_per_hour, gpus_by_type
from exporter.sizing.fleet.plan import FleetPlanner
from exporter.sizing.fleet.values import FleetInput, FleetModel, FleetPlan, Variant
from exporter.sizing.forecast import forecast
from exporter.sizing.reasons import REASON_MESSAGES, Reason
from exporter.sizing.recommender import Decision
from exporter.sizing.traffic import ModelInputs
from model import ServiceParams, Workload
from model.calibration.prior import CentreSource, gpus_of, prior_around, transferred
from model.calibration.trust import is_trusted


@dataclass(frozen=True, slots=True, kw_only=True)
class VariantStatus:
    """One variant after the plan: trust, the capacity counted on, the transfer it got."""

    deployment: str
    model_name: str
    trusted: bool
    capacity_rps: float  # per replica, as the plan counted it
    transferred_from: str | None = None  # the sibling its prior came from (None: none)
    transfer_capacity_error: float | None = None  # prior / own - 1, once calibrated


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetStatus:
    """What the fleet plan publishes after a cycle."""

    plan: FleetPlan | None  # None: no plan yet
    demand_rps: Mapping[str, float]  # the rate each model was planned for
    gpus_available: Mapping[str, int]  # per accelerator type, as the plan read it
    variants: Mapping[str, VariantStatus] = field(default_factory=dict)
    inputs: FleetInput | None = None  # what the last plan was made from (None: no plan yet)
    desired: Mapping[str, int] = field(default_factory=dict)  # the last plan's counts


def variant_capacity_rps(
    dep: DeploymentConfig,
    params: ServiceParams | None,
    workload: Workload | None,
    inputs: ModelInputs | None,
) -> float:
    """One replica's SLO capacity (req/s) at `params` for `workload`; 0 without either."""
    if params is None or workload is None:
        return 0.0
    inputs = inputs or ModelInputs(dep.model, dep.server)
    outlook = forecast(dep, params, workload, None, size_for_rps=0.0, per_replica_rps=0.0,
                       inputs=inputs)  # fmt: skip
    return outlook.plan.capacity.rate_rps


def attach_fleet(sizer: Sizer, fleet: FleetConfig | None) -> FleetSizer | None:
    """The fleet plan over `sizer`'s variants, attached to it (None without a fleet)."""
    if fleet is None:
        return None
    planner = FleetSizer(fleet, sizer.cycles)
    sizer.fleet = planner
    return planner


def keep_one(plan: FleetPlan, inp: FleetInput) -> FleetPlan:
    """`plan` with at least one replica per model: a model at 0 on every variant has no pod to
    measure its demand on, so it could never come back (a fleet has no scale_from_zero). The
    one replica goes to the cheapest variant with room for it."""
    desired = dict(plan.desired)
    free = {k: n - plan.gpus_planned.get(k, 0) for k, n in inp.inventory.items()}
    for m in inp.models:
        own = inp.own(m.name)
        if any(desired[v.name] for v in own):
            continue
        room = [v for v in own if v.max_replicas >= 1 and free.get(v.accelerator, 0)
                >= v.gpus_per_replica]  # fmt: skip
        if room:
            v = min(room, key=lambda x: (x.cost_per_replica_hour, x.name))
            desired[v.name] = 1
            free[v.accelerator] -= v.gpus_per_replica
    if desired == plan.desired:
        return plan
    models = {
        name: replace(share, cost_per_hour=sum(desired[v.name] * v.cost_per_replica_hour
                                               for v in inp.own(name)))
        for name, share in plan.models.items()
    }  # fmt: skip
    return replace(plan, desired=desired, models=models, gpus_planned=gpus_by_type(inp, desired),
                   cost_per_hour=cost_per_hour(inp, desired))  # fmt: skip


# The daemon plans on its inputs as read (FleetPlanner(steady=False)): with the held inputs
# and the pay-back wait of exporter/sizing/fleet/steady.py and plan.py, the live fleet test
# (tests/integration/test_fleet_live.py) stopped settling on the L40S plan it expects within
# its cycles (a rate spike across a change of pods held, then the H100 kept until the switch
# paid back); the fleet replay (bench/fleet.py) measures them. Open: wiring them here.
class FleetSizer:
    """Transfers priors between the variants of each model and plans their counts."""

    def __init__(self, fleet: FleetConfig, cycles: Mapping[str, DeploymentCycle]) -> None:
        self.fleet = fleet
        self.cycles = cycles
        self.planner = FleetPlanner(steady=False)
        self.last: FleetStatus | None = None
        self._transfers: dict[str, tuple[str, ServiceParams]] = {}
        self._transfer_errors: dict[str, float] = {}
        self._desired: dict[str, int] = {}  # the last plan's counts

    # -- persistence ----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe state for the state file: the planner's memory, the last counts, the
        transfers made and their measured errors."""
        return {
            "planner": self.planner.to_dict(),
            "desired": dict(self._desired),
            "transfers": {name: {"source": source, "params": list(params.as_tuple())}
                          for name, (source, params) in self._transfers.items()},
            "transfer_errors": dict(self._transfer_errors),
        }  # fmt: skip

    def restore(self, data: Mapping[str, Any], now_s: float) -> None:
        """Load what `to_dict` saved, for the variants still configured. Raises ValueError,
        TypeError, KeyError or AttributeError on a bad shape (nothing is assigned then)."""
        names = set(self.cycles)
        desired = {str(k): int(n) for k, n in data["desired"].items() if k in names}
        transfers = {
            str(k): (str(t["source"]), ServiceParams(*(float(x) for x in t["params"])))
            for k, t in data["transfers"].items() if k in names
        }  # fmt: skip
        errors = {str(k): float(x) for k, x in data["transfer_errors"].items() if k in names}
        if any(n < 0 for n in desired.values()):
            raise ValueError(f"desired: {desired!r}")
        planner = FleetPlanner(steady=False)
        planner.restore(data["planner"], now_s)
        self.planner, self._desired = planner, desired
        self._transfers, self._transfer_errors = transfers, errors

    # -- prior transfer ------------------------------------------------------------------

    def transfer_priors(self) -> None:
        """Give each variant without an estimate of its own the prior its most confident
        trusted sibling's estimate transfers to it (kept once its own pods fit)."""
        for model in self.fleet.models:
            source = self._trusted_sibling(model)
            if source is None:
                continue
            src = self.cycles[source]
            src_params = src.tuner.params
            assert src_params is not None and src.config.accelerator is not None
            src_spec = gpus_of(src.config.accelerator, src.config.gpus_per_replica)
            for name in model.variants:
                cycle = self.cycles[name]
                dep, tuner = cycle.config, cycle.tuner
                if name == source or tuner.params is not None or dep.accelerator is None:
                    continue
                spec = gpus_of(dep.accelerator, dep.gpus_per_replica)
                params = transferred(src_params, src_spec, spec)
                tuner.prior = prior_around(params, CentreSource.SEED)
                self._transfers[name] = (source, params)

    def _trusted_sibling(self, model: FleetModelConfig) -> str | None:
        best: tuple[float, str] | None = None
        for name in model.variants:
            cycle = self.cycles[name]
            if cycle.tuner.params is None or cycle.config.accelerator is None:
                continue
            confidence = cycle.tuner.estimate().confidence
            if is_trusted(confidence) and (best is None or confidence > best[0]):
                best = (confidence, name)
        return None if best is None else best[1]

    # -- the plan ------------------------------------------------------------------------

    def decide(
        self,
        now_s: float,
        estimates: Mapping[str, Estimate],
        decisions: dict[str, Decision],
        inventory: Mapping[str, int],
    ) -> FleetStatus:
        """Plan every model whose variants all observed this cycle, replace their decisions'
        counts with the plan's (and each recommender's last decision with it), hold the others
        at their last plan."""
        models, variants, demand = [], [], {}
        statuses: dict[str, VariantStatus] = {}
        for model in self.fleet.models:
            seen = [estimates.get(v) for v in model.variants]
            if any(e is None or e.observation is None for e in seen) or any(
                v not in decisions for v in model.variants
            ):
                continue
            if any(decisions[v].current_replicas and decisions[v].sizing_rate_rps is None
                   for v in model.variants):
                continue  # pods with no rate yet (a first window): the demand is not known
            workload = next((e.workload for e in seen if e and e.workload is not None), None)
            rate = 0.0
            for name in model.variants:
                estimate, decision = estimates[name], decisions[name]
                rate += decision.sizing_rate_rps or 0.0
                variant, status = self._variant(model, estimate, decision, workload)
                variants.append(variant)
                statuses[name] = status
            demand[model.name] = rate
            models.append(FleetModel(name=model.name, demand_rps=rate, priority=model.priority,
                                     routing=model.routing))  # fmt: skip
        available = self._inventory(inventory, variants)
        plan, inp = None, None
        if models:
            inp = FleetInput(
                models=tuple(models), variants=tuple(variants), inventory=available,
                untrusted_margin=self.fleet.untrusted_margin,
                switch_saving=self.fleet.switch_saving,
            )  # fmt: skip
            plan = keep_one(self.planner.decide(now_s, inp), inp)
            self._desired.update(plan.desired)
            held = self.planner.last_input
            if held is not None:  # the capacities and demand the plan counted on
                inp = held
                demand = {m.name: m.demand_rps for m in held.models}
                statuses = {
                    v.name: replace(statuses[v.name], capacity_rps=v.sizing_capacity_rps(
                        held.untrusted_margin))
                    for v in held.variants
                }  # fmt: skip
        self._apply(decisions, plan)
        self.last = FleetStatus(plan=plan, demand_rps=demand, gpus_available=available,
                                variants=statuses, inputs=inp, desired=dict(self._desired))
        return self.last

    def _variant(
        self,
        model: FleetModelConfig,
        estimate: Estimate,
        decision: Decision,
        workload: Workload | None,
    ) -> tuple[Variant, VariantStatus]:
        cycle = self.cycles[estimate.deployment]
        dep = cycle.config
        params = estimate.params
        if params is None and estimate.handover is not None:
            params = estimate.handover.params
        capacity = decision.sizing_capacity_rps  # the count's, not the published claim
        if capacity is None:
            capacity = variant_capacity_rps(dep, params, workload, estimate.inputs)
        trusted = estimate.params is not None and estimate.trusted
        self._note_transfer_error(dep, estimate, workload, trusted)
        assert dep.accelerator is not None  # the configuration requires it of a variant
        seen = decision.current_replicas or 0
        variant = Variant(
            name=dep.name, model=model.name, accelerator=dep.accelerator.value,
            gpus_per_replica=dep.gpus_per_replica,
            price_per_gpu_hour=self.fleet.accelerator(dep.accelerator).price_per_gpu_hour,
            capacity_rps=capacity, min_replicas=dep.min_replicas, max_replicas=dep.max_replicas,
            current_replicas=max(seen, self._desired.get(dep.name, 0)), ready_replicas=seen,
            trusted=trusted, stabilization_s=dep.scale_down_stabilization_s,
            startup_delay_s=dep.startup_delay_s or 0.0,
        )  # fmt: skip
        source = self._transfers.get(dep.name)
        status = VariantStatus(
            deployment=dep.name, model_name=model.name, trusted=trusted,
            capacity_rps=variant.sizing_capacity_rps(self.fleet.untrusted_margin),
            transferred_from=None if source is None else source[0],
            transfer_capacity_error=self._transfer_errors.get(dep.name),
        )  # fmt: skip
        return variant, status

    def _note_transfer_error(
        self, dep: DeploymentConfig, estimate: Estimate, workload: Workload | None, trusted: bool
    ) -> None:
        """Once a variant that got a transferred prior is trusted on its own pods: the
        transferred prior's capacity against its own estimate's, at the model's workload."""
        transfer = self._transfers.get(dep.name)
        if not trusted or transfer is None or dep.name in self._transfer_errors:
            return
        own = variant_capacity_rps(dep, estimate.params, workload, estimate.inputs)
        prior = variant_capacity_rps(dep, transfer[1], workload, estimate.inputs)
        if own > 0:
            self._transfer_errors[dep.name] = prior / own - 1.0

    def _inventory(self, inventory: Mapping[str, int], variants: list[Variant]
                   ) -> dict[str, int]:
        """The GPUs per configured type (a type not read: none), at least what the variants'
        minimums take (the minimums are the operator's: the plan cannot undo them)."""
        floor: dict[str, int] = {}
        for v in variants:
            floor[v.accelerator] = floor.get(v.accelerator, 0) + v.min_replicas * v.gpus_per_replica
        return {
            a.name.value: max(inventory.get(a.name.value, 0), floor.get(a.name.value, 0))
            for a in self.fleet.accelerators
        }

    def _apply(self, decisions: dict[str, Decision], plan: FleetPlan | None) -> None:
        """Each variant's decision carries the plan's count (this cycle's, else the last)."""
        for model in self.fleet.models:
            for name in model.variants:
                decision = decisions.get(name)
                count = self._desired.get(name)
                if decision is None or count is None:
                    continue
                planned = plan is not None and name in plan.desired
                decisions[name] = replace(
                    decision,
                    desired_replicas=count,
                    model_replicas=plan.target[name] if plan and planned else count,
                    reason=Reason.FLEET_PLAN,
                    message=REASON_MESSAGES[Reason.FLEET_PLAN] if planned else FLEET_HELD,
                )
                self.cycles[name].recommender.last = decisions[name]


FLEET_HELD = "the last fleet plan's count: a variant of this model read nothing this cycle"
