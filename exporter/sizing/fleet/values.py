"""The fleet decision's inputs and its plan: frozen values, rates in req/s, prices per GPU-hour."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from exporter.config.values import DEFAULT_STABILIZATION_S, DEFAULT_SWITCH_SAVING
from exporter.config.values import DEFAULT_UNTRUSTED_MARGIN as DEFAULT_UNTRUSTED_MARGIN
from exporter.config.values import Routing as Routing

# An untrusted variant is sized at its prior capacity less DEFAULT_UNTRUSTED_MARGIN, unless
# told otherwise; a mix is replaced only when the new one costs at least DEFAULT_SWITCH_SAVING
# less (both in exporter/config/values.py, where the configuration reads them).
# The solver's time for one plan, shared by its stages: a stage that runs out keeps the best
# plan found so far (proven optimal when every stage finishes). A plan out of time takes all
# of it and about 0.1-0.4 s more (enumeration, quick plans): 0.6 s keeps a 200-model decision
# under a second (bench/fleet_speed.py).
DEFAULT_SOLVE_TIME_LIMIT_S = 0.6


class PlanReason(StrEnum):
    """Why a model's (or the fleet's) counts are what they are; values are exported labels."""

    LEAST_COST = "least_cost"
    KEPT_FOR_STABILITY = "kept_for_stability"
    INVENTORY_LIMITED = "inventory_limited"
    PRIORITY_LIMITED = "priority_limited"
    MAX_REPLICAS = "max_replicas"
    NO_DEMAND = "no_demand"


PLAN_MESSAGES: dict[PlanReason, str] = {
    PlanReason.LEAST_COST: "the cheapest counts that carry the demand within the GPUs there are",
    PlanReason.KEPT_FOR_STABILITY: "a cheaper plan exists, but saves less than the switch share "
    "or has not yet paid for the replicas a switch holds and starts: the current plan is kept",
    PlanReason.INVENTORY_LIMITED: "the GPUs there are cannot carry all the demand: the rest is "
    "reported unserved",
    PlanReason.PRIORITY_LIMITED: "GPUs this model could use went to a higher-priority model: "
    "the rest is reported unserved",
    PlanReason.MAX_REPLICAS: "every variant is at replicas.max and the demand is not carried",
    PlanReason.NO_DEMAND: "no demand: each variant at its minimum",
}


def _require(ok: bool, key: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{key}: invalid value {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetModel:
    """One traffic stream: the rate to size for (margins and look-ahead applied), its priority
    (larger is served first) and how its traffic is routed."""

    name: str
    demand_rps: float
    priority: int = 0
    routing: Routing = Routing.WEIGHTED

    def __post_init__(self) -> None:
        rate = self.demand_rps
        _require(math.isfinite(rate) and rate >= 0, f"models.{self.name}.demand_rps", rate)


@dataclass(frozen=True, slots=True, kw_only=True)
class Variant:
    """One Deployment serving a model on one accelerator type. `capacity_rps` is one
    replica's SLO capacity on the variant's own estimate; an untrusted variant is sized at
    `prior_capacity_rps` (else `capacity_rps`) less the fleet's untrusted margin."""

    name: str
    model: str
    accelerator: str
    gpus_per_replica: int
    price_per_gpu_hour: float
    capacity_rps: float
    min_replicas: int = 0
    max_replicas: int = 10
    current_replicas: int = 0
    ready_replicas: int = 0
    trusted: bool = True
    prior_capacity_rps: float | None = None
    stabilization_s: float = DEFAULT_STABILIZATION_S  # scale-down window, as a deployment's
    startup_delay_s: float = 0.0  # from asked for to ready (s): a new replica's cost unserved

    def __post_init__(self) -> None:
        key = f"variants.{self.name}"
        _require(self.gpus_per_replica >= 1, f"{key}.gpus_per_replica", self.gpus_per_replica)
        price = self.price_per_gpu_hour
        _require(math.isfinite(price) and price >= 0, f"{key}.price_per_gpu_hour", price)
        for name in ("capacity_rps", "prior_capacity_rps"):
            rate = getattr(self, name)
            _require(rate is None or (math.isfinite(rate) and rate >= 0), f"{key}.{name}", rate)
        _require(self.min_replicas >= 0, f"{key}.min_replicas", self.min_replicas)
        _require(self.max_replicas >= self.min_replicas, f"{key}.max_replicas", self.max_replicas)
        _require(self.current_replicas >= 0, f"{key}.current_replicas", self.current_replicas)
        _require(self.ready_replicas >= 0, f"{key}.ready_replicas", self.ready_replicas)
        window = self.stabilization_s
        _require(math.isfinite(window) and window >= 0, f"{key}.stabilization_s", window)
        delay = self.startup_delay_s
        _require(math.isfinite(delay) and delay >= 0, f"{key}.startup_delay_s", delay)

    @property
    def cost_per_replica_hour(self) -> float:
        return self.gpus_per_replica * self.price_per_gpu_hour

    def sizing_capacity_rps(self, untrusted_margin: float) -> float:
        """The per-replica rate the plan counts on."""
        if self.trusted:
            return self.capacity_rps
        prior = self.capacity_rps if self.prior_capacity_rps is None else self.prior_capacity_rps
        return prior * (1.0 - untrusted_margin)


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetInput:
    """Everything one fleet decision reads. `inventory` holds the GPUs per accelerator type
    the fleet may use (a type not listed has none); the variants' minimums must fit in it."""

    models: tuple[FleetModel, ...]
    variants: tuple[Variant, ...]
    inventory: Mapping[str, int]
    untrusted_margin: float = DEFAULT_UNTRUSTED_MARGIN
    switch_saving: float = DEFAULT_SWITCH_SAVING
    solve_time_limit_s: float = DEFAULT_SOLVE_TIME_LIMIT_S
    # Indexes built once (a fleet of hundreds of models reads them per model and variant).
    _models: Mapping[str, FleetModel] = field(init=False, repr=False, compare=False)
    _own: Mapping[str, tuple[Variant, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "inventory", MappingProxyType(dict(self.inventory)))
        names = {m.name: m for m in self.models}
        _require(len(names) == len(self.models), "models", [m.name for m in self.models])
        own: dict[str, list[Variant]] = {name: [] for name in names}
        variants = [v.name for v in self.variants]
        _require(len(set(variants)) == len(variants), "variants", variants)
        for v in self.variants:
            _require(v.model in names, f"variants.{v.name}.model", v.model)
            own[v.model].append(v)
        object.__setattr__(self, "_models", MappingProxyType(names))
        object.__setattr__(self, "_own", MappingProxyType({k: tuple(x) for k, x in own.items()}))
        for kind, gpus in self.inventory.items():
            _require(gpus >= 0, f"inventory.{kind}", gpus)
        for kind, floor in self.min_gpus().items():
            have = self.inventory.get(kind, 0)
            _require(floor <= have, f"inventory.{kind} (minimums need {floor} GPUs)", have)
        margin = self.untrusted_margin
        _require(0 <= margin < 1, "untrusted_margin", margin)
        _require(0 <= self.switch_saving < 1, "switch_saving", self.switch_saving)
        _require(self.solve_time_limit_s > 0, "solve_time_limit_s", self.solve_time_limit_s)

    def min_gpus(self) -> dict[str, int]:
        """GPUs per type the variants' minimums take."""
        floor: dict[str, int] = {}
        for v in self.variants:
            floor[v.accelerator] = floor.get(v.accelerator, 0) + v.min_replicas * v.gpus_per_replica
        return floor

    def model(self, name: str) -> FleetModel:
        return self._models[name]

    def own(self, model: str) -> tuple[Variant, ...]:
        """The model's variants, in input order."""
        return self._own[model]


@dataclass(frozen=True, slots=True, kw_only=True)
class Allocation:
    """An integer plan: replicas per variant (by name), the unserved rate per model, and the
    lexicographic objective it was chosen on."""

    replicas: Mapping[str, int]
    unserved_rps: Mapping[str, float]
    cost_per_hour: float
    optimal: bool = True  # False: a solver stage hit its time limit, the best found stands


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelPlan:
    """One model's share of the plan."""

    reason: PlanReason
    cost_per_hour: float  # of the desired counts
    unserved_rps: float


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetPlan:
    """The fleet decision: `target` is the optimizer's count per variant, `desired` what to
    run now (the target held up by make-before-break and scale-down stabilization)."""

    reason: PlanReason
    target: Mapping[str, int]
    desired: Mapping[str, int]
    models: Mapping[str, ModelPlan]
    gpus_planned: Mapping[str, int] = field(default_factory=dict)  # of `desired`, per type
    cost_per_hour: float = 0.0  # of `desired`
    optimal: bool = True  # the target is proven least-cost (no solver stage timed out)

    @property
    def unserved_rps(self) -> dict[str, float]:
        return {name: plan.unserved_rps for name, plan in self.models.items()}
