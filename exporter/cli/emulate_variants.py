"""`emulate --variant`: a mixed fleet from the variant truths.

`vllm-sizer emulate --variant NAME=ACCEL[xTP][:REPLICAS] ...` serves several variants of one
model, each with the test bed's truth for its accelerator and tensor parallel size
(exporter/testbed/variant_truths.py), each Deployment's pods on their own ports."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from exporter.testbed.mixed_emulator import PORTS_PER_VARIANT
from exporter.testbed.variant_truths import TENSOR_PARALLEL, ServedModel, truth
from model.calibration.prior import Accelerator
from model.queueing.params import ServerConfig
from model.simulation.mixed import FleetRouting, VariantSpec

_VARIANT = re.compile(r"^(?P<name>[a-z0-9][a-z0-9-]*)=(?P<accel>[A-Za-z0-9]+?)"
                      r"(?:x(?P<tp>\d+))?(?::(?P<replicas>\d+))?$")


@dataclass(frozen=True, slots=True)
class VariantFlag:
    """One --variant: a Deployment name, its accelerator, GPUs per replica, initial replicas."""

    name: str
    accelerator: Accelerator
    tensor_parallel: int
    replicas: int


def variant_flag(text: str) -> VariantFlag:
    """argparse type of --variant."""
    m = _VARIANT.match(text)
    kinds = ", ".join(a.value for a in Accelerator)
    if m is None:
        raise argparse.ArgumentTypeError(
            f"must be NAME=ACCELERATOR[xTP][:REPLICAS], e.g. h100=H100x2:3, got {text!r}")
    try:
        accel = Accelerator(m["accel"].upper())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"accelerator must be one of {kinds}, got {m['accel']!r}") from None
    tp = int(m["tp"] or 1)
    if tp not in TENSOR_PARALLEL:
        raise argparse.ArgumentTypeError(
            f"tensor parallel size must be one of {', '.join(map(str, TENSOR_PARALLEL))}, "
            f"got {tp}")
    replicas = int(m["replicas"] if m["replicas"] is not None else 1)
    if not 0 <= replicas <= PORTS_PER_VARIANT:
        raise argparse.ArgumentTypeError(
            f"replicas must be an integer >= 0 and <= {PORTS_PER_VARIANT}, got {replicas}")
    return VariantFlag(m["name"], accel, tp, replicas)


def add_variant_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--variant", type=variant_flag, action="append", metavar="NAME=ACCEL[xTP][:N]",
                   help="serve a mixed fleet: one Deployment NAME of N replicas (default 1) on "
                        "ACCEL (H100, H200, A100, L40S, MI300X) at tensor parallel size TP (1, "
                        "2, 4), with the test bed's true parameters for --truth-model; repeat "
                        "per variant. --alpha-ms/--beta-ms/--gamma-ms, --replicas, --router and "
                        "--kv-capacity-tokens are then not used")
    p.add_argument("--truth-model", choices=[m.value for m in ServedModel],
                   default=ServedModel.LLAMA_8B.value,
                   help="the model whose variant truths --variant serves")
    p.add_argument("--routing", choices=[r.value for r in FleetRouting],
                   default=FleetRouting.LEAST_LOADED.value,
                   help="how a mixed fleet's gateway routes (--variant): even (round robin), "
                        "least_loaded (fewest running + waiting) or weighted (by each variant's "
                        "share of capacity)")


def check_variants(flags: list[VariantFlag]) -> str | None:
    names = [f.name for f in flags]
    if len(set(names)) != len(names):
        return f"argument --variant: names must be unique, got {', '.join(names)}"
    return None


def variant_specs(flags: list[VariantFlag], model: str, server: ServerConfig
                  ) -> tuple[list[VariantSpec], dict[str, int], dict[str, float]]:
    """The variants, their initial replicas and the weighted rule's weights: each variant's
    share of capacity, its replicas over its per-token time (1 / beta)."""
    specs, replicas, weights = [], {}, {}
    for f in flags:
        t = truth(ServedModel(model), f.accelerator, f.tensor_parallel)
        specs.append(VariantSpec(name=f.name, params=t.params, server=server,
                                 kv_capacity_tokens=t.kv_capacity_tokens,
                                 startup_delay_s=t.startup_delay_s))
        replicas[f.name] = f.replicas
        weights[f.name] = f.replicas / t.params.beta_ms
    return specs, replicas, weights
