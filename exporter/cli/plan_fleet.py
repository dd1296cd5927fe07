"""`vllm-sizer plan --config fleet.yaml --fleet-model NAME --rate RPS`: the cheapest mix of a
model's variants for a rate, under its targets (or --ttft-ms, --itl-ms, --slo), on the GPUs the
configuration lists (or --inventory).

Each variant's capacity per replica comes from --capacity NAME=RPS when given (e.g. the daemon's
vllm_sizer_variant_capacity_requests_per_second, to check its plan), else from its parameters:
a daemon's state file (--state) where it holds the variant's calibration, else the prior the
daemon would give it (transferred from a trusted sibling in the state, else physical), at the
--input-tokens / --output-tokens workload, by the model alone (the daemon's decisions also
correct for its recent windows' bias and evidence, so those capacities can differ). A variant
not calibrated on its own pods is counted at its capacity less `fleet_plan.untrusted_margin`,
as the daemon counts it.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

from exporter.base.errors import ConfigError
from exporter.config.checks import UnusableConfigError
from exporter.config.loader import load_config
from exporter.config.values import Config, DeploymentConfig, SloConfig
from exporter.daemon.deployment_state import restore_state
from exporter.daemon.statefile import read_state
from exporter.sizing.cycle import Sizer
from exporter.sizing.fleet_cycle import attach_fleet, variant_capacity_rps
from exporter.sizing.fleet_whatif import MixAnswer, cheapest_mix, model_variants
from exporter.sizing.handover import handover
from model import Workload
from model.calibration.trust import is_trusted

# The request shape `plan` assumes where neither flags nor a state file give one.
DEFAULT_SHAPE = Workload(1024.0, 512.0)


def add_fleet_arguments(plan: argparse.ArgumentParser) -> None:
    plan.add_argument("--config", type=Path, metavar="PATH",
                      help="a daemon configuration with a `models` section: answer the cheapest "
                      "mix of --fleet-model's variants for --rate")  # fmt: skip
    plan.add_argument("--fleet-model", metavar="NAME", help="a `models` entry's name")
    plan.add_argument("--rate", type=float, metavar="RPS", help="the model's rate, req/s")
    plan.add_argument("--state", type=Path, metavar="PATH",
                      help="a daemon's state file (state_file): with --config, its variants' "
                      "calibrations; without, alpha, beta, gamma and the request shape of "
                      "--deployment (flags given override them), and each claim's distance "
                      "from the per-replica rates its windows observed")  # fmt: skip
    plan.add_argument("--capacity", action="append", default=[], metavar="VARIANT=RPS",
                      help="a variant's capacity per replica as counted (repeatable)")
    plan.add_argument("--inventory", action="append", default=[], metavar="TYPE=GPUS",
                      help="GPUs of an accelerator type (repeatable; default: the configured "
                      "static counts; a queried one must be given)")  # fmt: skip


def fleet_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the fleet arguments (None: nothing, or not a fleet query)."""
    if args.config is None:
        given = [f for f in ("fleet_model", "rate") if getattr(args, f) is not None]
        if given or args.capacity or args.inventory:
            return "argument --config: is required with --fleet-model, --rate, " \
                   "--capacity and --inventory"
        return None
    if args.fleet_model is None or args.rate is None:
        return "argument --config: needs --fleet-model and --rate"
    if not (math.isfinite(args.rate) and args.rate >= 0):
        return f"argument --rate: must be a number >= 0 (req/s), got {args.rate:g}"
    for flag, entries in (("--capacity", args.capacity), ("--inventory", args.inventory)):
        for entry in entries:
            key, sep, value = entry.partition("=")
            if not sep or not key or _number(value) is None:
                return f"argument {flag}: must be NAME=NUMBER >= 0, got {entry!r}"
    return None


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def run_fleet_plan(args: argparse.Namespace, targets: SloConfig) -> int:
    try:
        config = load_config(args.config, resolve_hosts=False)
    except (ConfigError, UnusableConfigError) as exc:
        print(f"vllm-sizer plan: {args.config}: {exc}", file=sys.stderr)
        return 2
    try:
        answer = fleet_answer(config, args, targets)
    except LookupError as exc:
        print(f"vllm-sizer plan: {exc.args[0]}", file=sys.stderr)
        return 2
    print(f"cheapest mix of {answer.model} for {answer.rate_rps:g} req/s ({answer.reason})")
    print("variant | replicas | capacity per replica req/s")
    for name, count in answer.replicas.items():
        print(f"{name} | {count} | {answer.capacity_rps[name]:.3f}")
    gpus = ", ".join(f"{k} {n}/{answer.gpus_available.get(k, 0)}" for k, n in answer.gpus.items())
    print(f"cost per hour {answer.cost_per_hour:.2f}; unserved {answer.unserved_rps:.3f} req/s; "
          f"GPUs planned/available: {gpus or 'none'}")  # fmt: skip
    return 0


def fleet_answer(config: Config, args: argparse.Namespace, targets: SloConfig) -> MixAnswer:
    """The cheapest mix the arguments ask for (LookupError: unknown model or variant, or an
    inventory the configuration reads from a query and the arguments do not give)."""
    fleet = config.fleet
    if fleet is None:
        raise LookupError(f"{args.config}: has no `models` section")
    model = next((m for m in fleet.models if m.name == args.fleet_model), None)
    if model is None:
        known = ", ".join(m.name for m in fleet.models)
        raise LookupError(f"--fleet-model: unknown model {args.fleet_model!r} (known: {known})")
    overridden = targets.ttft_ms is not None or targets.itl_ms is not None or targets.percentiles
    deps = {d.name: (replace(d, slo=targets) if overridden else d) for d in config.deployments}
    given = {k: float(v) for k, _, v in (e.partition("=") for e in args.capacity)}
    unknown = set(given) - set(model.variants)
    if unknown:
        names = ", ".join(sorted(unknown))
        raise LookupError(f"--capacity: not a variant of {model.name}: {names}")
    capacities, trusted = _capacities(config, deps, model.variants, args)
    capacities.update(given)
    trusted.update(dict.fromkeys(given, True))  # as counted: the margin is in it
    inventory = {a.name.value: a.inventory for a in fleet.accelerators if a.inventory is not None}
    inventory.update({k: int(float(v)) for k, _, v in (e.partition("=") for e in args.inventory)})
    needed = {str(deps[v].accelerator) for v in model.variants}
    missing = sorted(needed - set(inventory))
    if missing:
        raise LookupError(f"--inventory: give the GPUs of {', '.join(missing)} (read from a "
                          "query by the daemon), e.g. --inventory " + f"{missing[0]}=8")
    variants = model_variants(fleet, deps, model, capacities, trusted)
    return cheapest_mix(variants, model, args.rate, inventory, fleet.untrusted_margin)


def _capacities(
    config: Config, deps: dict[str, DeploymentConfig], names: tuple[str, ...],
    args: argparse.Namespace,
) -> tuple[dict[str, float], dict[str, bool]]:
    """Each variant's capacity from its parameters, and whether they are its own trusted ones."""
    sizer = Sizer(list(deps.values()))
    fleet = attach_fleet(sizer, config.fleet)
    if args.state is not None:
        problem, state = read_state(args.state)
        if problem is not None:
            raise LookupError(f"--state: {args.state}: {problem}")
        restore_state(state, sizer.cycles, 0.0)
    if fleet is not None:
        fleet.transfer_priors()
    workload = Workload(
        DEFAULT_SHAPE.avg_input_tokens if args.input_tokens is None else args.input_tokens,
        DEFAULT_SHAPE.avg_output_tokens if args.output_tokens is None else args.output_tokens,
    )
    capacities, trusted = {}, {}
    for name in names:
        cycle = sizer.cycles[name]
        tuner = cycle.tuner
        params = tuner.params or handover(tuner.initial, tuner.prior.centre).params
        own = tuner.params is not None and is_trusted(tuner.confidence())
        capacities[name] = variant_capacity_rps(deps[name], params, workload,
                                                None)
        trusted[name] = own
    return capacities, trusted
