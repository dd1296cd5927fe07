"""A fleet replay's setup: models, variants, prices, inventory.

`vllm-sizer replay --config fleet.yaml` reads a file with a top-level `fleet:` section:

    fleet:
      window_s: 30                 # one decision per window
      demand_margin: 0.1           # the rate planned for: the last windows' highest, +10 %
      switch_saving: 0.1           # the optimizer's stability share
      accelerators:
        H100: {price_per_gpu_hour: 4.0, inventory: 8}
        L40S: {price_per_gpu_hour: 1.0, inventory: 16}
      models:
        - name: chat
          truth_model: llama-3.1-8b   # whose variant truths the fleet simulates
          share: 1.0                  # of the trace's requests this model receives
          priority: 0
          routing: weighted           # what the plan assumes: weighted or even
          gateway: least_loaded       # what the simulated gateway does: even, least_loaded,
                                      # weighted
          slo: {ttft_ms: 1000, itl_ms: 50}
          variants:
            - {name: chat-h100, accelerator: H100, tensor_parallel: 1, min: 0, max: 8,
               initial: 1, max_num_seqs: 256, max_num_batched_tokens: 8192}

The truths come from exporter/testbed/variant_truths.py. Every bad key is reported at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.config.checks import KeyReader, choice, integer, number, read_yaml, string
from exporter.config.fleet import parse_accelerators
from exporter.sizing.fleet.values import Routing
from exporter.testbed.variant_truths import TENSOR_PARALLEL, ServedModel, VariantTruth, truth
from model.calibration.prior import Accelerator
from model.queueing.params import ServerConfig
from model.simulation.mixed import FleetRouting, VariantSpec

DEFAULT_WINDOW_S = 30.0
DEFAULT_DEMAND_MARGIN = 0.1
DEFAULT_SWITCH_SAVING = 0.1
MAX_REPLICAS = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetVariant:
    """One Deployment: a model on `gpus` GPUs of one accelerator type, and its truth."""

    name: str
    model: str
    accelerator: str
    gpus: int
    truth: VariantTruth
    server: ServerConfig
    min_replicas: int = 0
    max_replicas: int = 10
    initial: int = 0

    @property
    def spec(self) -> VariantSpec:
        """What the simulator runs."""
        t = self.truth
        return VariantSpec(name=self.name, params=t.params, server=self.server,
                           kv_capacity_tokens=t.kv_capacity_tokens,
                           startup_delay_s=t.startup_delay_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetModelSetup:
    """One traffic stream and its variants."""

    name: str
    share: float
    priority: int
    routing: Routing
    gateway: FleetRouting
    ttft_ms: float
    itl_ms: float
    variants: tuple[FleetVariant, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetSetup:
    models: tuple[FleetModelSetup, ...]
    prices: Mapping[str, float]  # per GPU-hour, by accelerator type
    inventory: Mapping[str, int]  # GPUs by accelerator type
    window_s: float = DEFAULT_WINDOW_S
    demand_margin: float = DEFAULT_DEMAND_MARGIN
    switch_saving: float = DEFAULT_SWITCH_SAVING

    @property
    def variants(self) -> tuple[FleetVariant, ...]:
        return tuple(v for m in self.models for v in m.variants)

    def cost_per_replica_hour(self, v: FleetVariant) -> float:
        return v.gpus * self.prices[v.accelerator]

    @property
    def judged_from_s(self) -> float:
        """The first judged window's start: the first decision's replicas can all serve."""
        return self.window_s + max(v.truth.startup_delay_s for v in self.variants)


def is_fleet_config(path: Path) -> bool:
    """True when the file has a top-level `fleet:` section."""
    data = read_yaml(path)
    return isinstance(data, Mapping) and "fleet" in data


def load_fleet(path: Path) -> FleetSetup:
    """The `fleet:` section of a file; ConfigError names every bad key."""
    data = read_yaml(path)
    r = KeyReader()
    top = r.mapping(data, "", {"fleet"})
    setup = parse_fleet(r, top.get("fleet"), "fleet")
    if r.problems or setup is None:
        raise r.error()
    return setup


def parse_fleet(r: KeyReader, node: Any, path: str) -> FleetSetup | None:
    m = r.mapping(node, path, {"window_s", "demand_margin", "switch_saving", "accelerators",
                               "models"})
    window = r.get(m, "window_s", path, number(0.0, 3600.0), "must be a number > 0 and <= 3600 "
                   "(seconds)", DEFAULT_WINDOW_S)
    margin = r.get(m, "demand_margin", path, number(0.0, 10.0, inclusive=True),
                   "must be a number >= 0 and <= 10", DEFAULT_DEMAND_MARGIN)
    saving = r.get(m, "switch_saving", path, number(0.0, 0.99, inclusive=True),
                   "must be a number >= 0 and < 1", DEFAULT_SWITCH_SAVING)
    accelerators = parse_accelerators(r, m.get("accelerators"), f"{path}.accelerators",
                                      queries=False)  # the daemon's schema, static counts only
    prices = {a.name.value: a.price_per_gpu_hour for a in accelerators}
    inventory = {a.name.value: a.inventory or 0 for a in accelerators}
    models_node = m.get("models")
    if not isinstance(models_node, list) or not models_node:
        r.fail(f"{path}.models", "must be a non-empty list of models", models_node)
        return None
    models = [_model(r, node, f"{path}.models[{i}]", prices) for i, node in enumerate(models_node)]
    names = [v.name for mod in models if mod is not None for v in mod.variants]
    names += [mod.name for mod in models if mod is not None]
    if len(set(names)) != len(names):
        r.fail(f"{path}.models", "model and variant names must be unique", names)
    shares = sum(mod.share for mod in models if mod is not None)
    if shares > 1.0 + 1e-9:
        r.fail(f"{path}.models", "the models' shares must add up to at most 1", shares)
    if r.problems or any(mod is None for mod in models):
        return None
    return FleetSetup(models=tuple(mod for mod in models if mod is not None), prices=prices,
                      inventory=inventory, window_s=window, demand_margin=margin,
                      switch_saving=saving)


def _model(r: KeyReader, node: Any, path: str, prices: Mapping[str, float]
           ) -> FleetModelSetup | None:
    m = r.mapping(node, path, {"name", "truth_model", "share", "priority", "routing", "gateway",
                               "slo", "variants"})
    name = r.required(m, "name", path, string(), "must be a string")
    served = tuple(x.value for x in ServedModel)
    model = r.required(m, "truth_model", path, choice(served), f"must be one of "
                       f"{', '.join(served)}")
    share = r.get(m, "share", path, number(0.0, 1.0), "must be a number > 0 and <= 1", 1.0)
    priority = r.get(m, "priority", path, integer(-1000, 1000),
                     "must be an integer >= -1000 and <= 1000", 0)
    routes = tuple(x.value for x in Routing)
    routing = r.get(m, "routing", path, choice(routes), f"must be one of {', '.join(routes)}",
                    Routing.WEIGHTED.value)
    gates = tuple(x.value for x in FleetRouting)
    gateway = r.get(m, "gateway", path, choice(gates), f"must be one of {', '.join(gates)}",
                    FleetRouting.LEAST_LOADED.value)
    slo = r.mapping(m.get("slo"), f"{path}.slo", {"ttft_ms", "itl_ms"})
    ttft = r.required(slo, "ttft_ms", f"{path}.slo", number(0.0), "must be a number > 0 (ms)")
    itl = r.required(slo, "itl_ms", f"{path}.slo", number(0.0), "must be a number > 0 (ms)")
    nodes = m.get("variants")
    if not isinstance(nodes, list) or not nodes:
        r.fail(f"{path}.variants", "must be a non-empty list of variants", nodes)
        return None
    served_model = ServedModel(model or ServedModel.LLAMA_8B.value)
    variants = [_variant(r, v, f"{path}.variants[{i}]", name or "", served_model, prices)
                for i, v in enumerate(nodes)]
    if name is None or model is None or ttft is None or itl is None:
        return None
    if any(v is None for v in variants):
        return None
    return FleetModelSetup(name=name, share=share, priority=priority, routing=Routing(routing),
                           gateway=FleetRouting(gateway), ttft_ms=ttft, itl_ms=itl,
                           variants=tuple(v for v in variants if v is not None))


def _variant(r: KeyReader, node: Any, path: str, model: str, served: ServedModel,
             prices: Mapping[str, float]) -> FleetVariant | None:
    m = r.mapping(node, path, {"name", "accelerator", "tensor_parallel", "min", "max", "initial",
                               "max_num_seqs", "max_num_batched_tokens"})
    name = r.required(m, "name", path, string(), "must be a string")
    kind = r.required(m, "accelerator", path, choice(tuple(prices)),
                      f"must be one of the accelerators listed ({', '.join(prices) or 'none'})")
    tps = ", ".join(map(str, TENSOR_PARALLEL))
    tp = r.get(m, "tensor_parallel", path, lambda x: x if x in TENSOR_PARALLEL and
               isinstance(x, int) else None, f"must be one of {tps}", 1)
    low = r.get(m, "min", path, integer(0, MAX_REPLICAS), f"must be an integer >= 0 and <= "
                f"{MAX_REPLICAS}", 0)
    high = r.get(m, "max", path, integer(max(low, 1), MAX_REPLICAS),
                 f"must be an integer >= min (and >= 1) and <= {MAX_REPLICAS}", 10)
    initial = r.get(m, "initial", path, integer(low, high), "must be an integer >= min and "
                    "<= max", low)
    seqs = r.get(m, "max_num_seqs", path, integer(1, 4096), "must be an integer >= 1 and <= 4096",
                 256)
    batched = r.get(m, "max_num_batched_tokens", path, integer(1, 1 << 20),
                    "must be an integer >= 1", 8192)
    if name is None or kind is None:
        return None
    found = truth(served, Accelerator(kind), tp)
    if found.kv_capacity_tokens <= 0:
        r.fail(f"{path}.tensor_parallel", f"{served.value}'s weights do not fit on {tp} {kind}", tp)
        return None
    return FleetVariant(name=name, model=model, accelerator=kind, gpus=tp, truth=found,
                        server=ServerConfig(seqs, batched), min_replicas=low,
                        max_replicas=high, initial=initial)
