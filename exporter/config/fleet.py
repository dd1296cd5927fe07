"""The `accelerators`, `models` and `fleet_plan` sections: a model served by several
Deployments (its variants), each on one accelerator type, sized together by the least-cost plan.

    accelerators:
      H100: {price_per_gpu_hour: 4.0, inventory: 8}
      L40S: {price_per_gpu_hour: 1.0, inventory: {query: 'sum(...)'}}
    models:
      - name: llama-3.1-8b             # vLLM's --served-model-name
        priority: 0
        routing: weighted               # or even
        slo: {ttft: {p95_ms: 300}}
        variants:
          - name: chat-h100             # the Deployment, as a lone deployment's keys
            accelerator: H100
            gpus_per_replica: 1
            startup_delay_s: 120
            source: {prometheus_selector: '{namespace="ai", deployment="chat-h100"}'}

A variant takes a lone deployment's keys, less those its model gives (`model_name`, `slo`,
`slo_window_s`, `model`) and `scale_from_zero` (the plan brings a variant back from 0). The
`deployments` list stays valid beside or without `models`: each of its entries is sized alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from exporter.config.checks import KeyReader, choice, integer, number, string
from exporter.config.replicas import promql_expression
from exporter.config.served_model import CV_KEYS, model_options
from exporter.config.slo import parse_slo
from exporter.config.values import (
    DEFAULT_SWITCH_SAVING,
    DEFAULT_UNTRUSTED_MARGIN,
    MAX_QUERY_CHARS,
    AcceleratorConfig,
    DeploymentConfig,
    FleetConfig,
    FleetModelConfig,
    Routing,
    SloConfig,
)
from model import ModelOptions
from model.calibration.prior import Accelerator

MAX_GPUS_PER_REPLICA = 64
MAX_INVENTORY = 1_000_000
MAX_STARTUP_DELAY_S = 3600.0
MAX_PRIORITY = 1000
MAX_PRICE = 1e6  # per GPU-hour

# A lone deployment's keys (exporter/config/loader.py) that a variant's model gives, or that
# the plan replaces.
_FROM_MODEL = {"model_name", "slo", "slo_window_s", "model", "scale_from_zero"}
VARIANT_KEYS = {
    "name", "source", "server", "replicas", "scale_down_stabilization_s", "look_ahead_s",
    "rate_margin_sigmas", "initial_params", "accelerator", "tuner", "gpus_per_replica",
    "startup_delay_s",
}  # fmt: skip


class Inherited(NamedTuple):
    """What a variant takes from its model."""

    model_name: str
    slo: SloConfig
    options: ModelOptions
    pinned: frozenset[str]


# Parses one variant node at a path, with what it inherits (the loader's `_deployment`).
VariantParser = Callable[[Any, str, Inherited], DeploymentConfig | None]


def gpu_count_and_startup(
    r: KeyReader, m: Mapping[str, Any], path: str, *, variant: bool
) -> tuple[int, float | None]:
    """`gpus_per_replica` (any deployment) and `startup_delay_s` (a variant's)."""
    gpus = r.get(
        m, "gpus_per_replica", path, integer(1, MAX_GPUS_PER_REPLICA),
        f"must be an integer >= 1 and <= {MAX_GPUS_PER_REPLICA} (tensor parallelism)", 1,
    )  # fmt: skip
    startup = None
    if variant:
        startup = r.get(
            m, "startup_delay_s", path, number(0.0, MAX_STARTUP_DELAY_S, inclusive=True),
            f"must be a number >= 0 and <= {MAX_STARTUP_DELAY_S:g} (seconds from scheduled to "
            "ready)", None,
        )  # fmt: skip
    return gpus, startup


def parse_fleet(
    r: KeyReader, top: Mapping[str, Any], variant: VariantParser
) -> tuple[FleetConfig | None, list[DeploymentConfig]]:
    """The fleet sections of the top-level mapping (None and no variants without `models`)."""
    models_node = top.get("models")
    r.note("", "models", "a list of models, each with its variants (optional)")
    accelerators = _accelerators(r, top.get("accelerators"))
    for a in accelerators:
        if a.inventory_query is not None and top.get("prometheus") is None:
            r.fail(f"accelerators.{a.name.value}.inventory.query",
                   "needs the top-level `prometheus` section", a.inventory_query)
    switch, margin = _plan_settings(r, top.get("fleet_plan"))
    if models_node is None:
        if top.get("accelerators") is not None:
            r.fail("accelerators", "is used only with a `models` section", top["accelerators"])
        return None, []
    if not isinstance(models_node, list) or not models_node:
        r.fail("models", "must be a non-empty list of models", models_node)
        return None, []
    if top.get("accelerators") is None:
        r.fail("accelerators", "is required with `models` (price and GPUs of each type)", None)
    known = {a.name.value for a in accelerators}
    models: list[FleetModelConfig] = []
    variants: list[DeploymentConfig] = []
    for i, node in enumerate(models_node):
        parsed = _model(r, node, f"models[{i}]", variant, known)
        if parsed is not None:
            models.append(parsed[0])
            variants += parsed[1]
    names = [m.name for m in models]
    for name in {n for n in names if names.count(n) > 1}:
        r.fail("models", "model names must be unique", name)
    seen: set[str] = set()
    for dep in variants:
        if dep.name in seen:
            r.fail("models", "variant names must be unique", dep.name)
        seen.add(dep.name)
    fleet = FleetConfig(
        accelerators=tuple(accelerators), models=tuple(models), switch_saving=switch,
        untrusted_margin=margin,
    )  # fmt: skip
    return fleet, variants


def _plan_settings(r: KeyReader, node: Any) -> tuple[float, float]:
    path = "fleet_plan"
    m = r.mapping(node, path, {"switch_saving", "untrusted_margin"})
    switch = r.get(
        m, "switch_saving", path, number(0.0, 0.99, inclusive=True),
        "must be a number >= 0 and <= 0.99 (the share a new mix must save to replace the "
        "current one)", DEFAULT_SWITCH_SAVING,
    )  # fmt: skip
    margin = r.get(
        m, "untrusted_margin", path, number(0.0, 0.99, inclusive=True),
        "must be a number >= 0 and <= 0.99 (the share of an untrusted variant's capacity "
        "not counted on)", DEFAULT_UNTRUSTED_MARGIN,
    )  # fmt: skip
    return switch, margin


def parse_accelerators(
    r: KeyReader, node: Any, path: str, *, queries: bool = True
) -> list[AcceleratorConfig]:
    """Each accelerator type's price per GPU-hour and inventory: a static GPU count or (with
    `queries`) `{query: PromQL}`, read each cycle. Shared with the fleet replay's setup."""
    kinds = tuple(a.value for a in Accelerator)
    accels = r.mapping(node, path, set(kinds))
    for kind in kinds:
        r.note(path, kind, "a mapping: this type's price_per_gpu_hour and inventory (optional)")
    out: list[AcceleratorConfig] = []
    for kind, spec in accels.items():
        if kind not in kinds:  # reported by `mapping` as an unknown key
            continue
        where = f"{path}.{kind}" if path else str(kind)
        a = r.mapping(spec, where, {"price_per_gpu_hour", "inventory"})
        price = r.required(
            a, "price_per_gpu_hour", where, number(0.0, MAX_PRICE, inclusive=True),
            f"must be a number >= 0 and <= {MAX_PRICE:g} (per GPU-hour)",
        )  # fmt: skip
        static, query = _inventory(r, a, where, queries=queries)
        if price is not None and (static is not None or query is not None):
            out.append(AcceleratorConfig(
                name=Accelerator(kind), price_per_gpu_hour=price, inventory=static,
                inventory_query=query,
            ))  # fmt: skip
    return out


def _accelerators(r: KeyReader, node: Any) -> list[AcceleratorConfig]:
    return parse_accelerators(r, node, "accelerators")


def _inventory(
    r: KeyReader, a: Mapping[str, Any], where: str, *, queries: bool
) -> tuple[int | None, str | None]:
    rule = "must be an integer >= 0 (GPUs)"
    if queries:
        rule += " or {query: PromQL of one value, read each cycle}"
    r.note(where, "inventory", rule, required=True)
    node = a.get("inventory")
    if node is None:
        r.fail(f"{where}.inventory", "is required: " + rule, None)
        return None, None
    if isinstance(node, Mapping) and queries:
        q = r.mapping(node, f"{where}.inventory", {"query"})
        query = r.required(
            q, "query", f"{where}.inventory", promql_expression,
            f"a PromQL expression of one value (GPUs), at most {MAX_QUERY_CHARS} characters",
        )  # fmt: skip
        return None, query
    count = integer(0, MAX_INVENTORY)(node)
    if count is None:
        r.fail(f"{where}.inventory", rule, node)
    return count, None


def _model(
    r: KeyReader, node: Any, path: str, variant: VariantParser, known: set[str]
) -> tuple[FleetModelConfig, list[DeploymentConfig]] | None:
    before = len(r.problems)
    m = r.mapping(node, path, {"name", "priority", "routing", "variants"} | _FROM_MODEL - {
        "model_name", "scale_from_zero"})
    name = r.required(m, "name", path, string(), "vLLM's --served-model-name")
    priority = r.get(
        m, "priority", path, integer(-MAX_PRIORITY, MAX_PRIORITY),
        f"must be an integer >= {-MAX_PRIORITY} and <= {MAX_PRIORITY} (larger is served first)",
        0,
    )  # fmt: skip
    routes = tuple(x.value for x in Routing)
    routing = r.get(
        m, "routing", path, choice(routes), f"must be one of {', '.join(routes)}",
        Routing.WEIGHTED.value,
    )  # fmt: skip
    slo = parse_slo(r, m, path)
    options = model_options(r, m.get("model"), f"{path}.model")
    pinned = frozenset(k for k in CV_KEYS if k in (m.get("model") or {}))
    nodes = m.get("variants")
    r.note(path, "variants", "a non-empty list of variants (Deployments)", required=True)
    if not isinstance(nodes, list) or not nodes:
        r.fail(f"{path}.variants", "must be a non-empty list of variants", nodes)
        return None
    if len(r.problems) > before or name is None:
        return None
    inherit = Inherited(name, slo, options, pinned)
    variants: list[DeploymentConfig] = []
    for j, v in enumerate(nodes):
        where = f"{path}.variants[{j}]"
        dep = variant(v, where, inherit)
        if dep is None:
            continue
        if dep.accelerator is None or dep.accelerator.value not in known:
            listed = ", ".join(sorted(known)) or "none"
            r.fail(
                f"{where}.accelerator",
                f"must be one of the types in `accelerators` ({listed})",
                None if dep.accelerator is None else dep.accelerator.value,
            )
            continue
        variants.append(dep)
    if len(r.problems) > before:
        return None
    model = FleetModelConfig(
        name=name, priority=priority, routing=Routing(routing),
        variants=tuple(v.name for v in variants),
    )  # fmt: skip
    return model, variants
