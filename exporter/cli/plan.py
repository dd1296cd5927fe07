"""`vllm-sizer plan`: how latency grows with load and how many replicas a load range needs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from exporter.cli.fleet_options import (
    MAX_PARAM_MS,
    MAX_TARGET_MS,
    MAX_TOKENS,
    MAX_TOTAL_RPS,
    add_renamed_flag,
    add_server_limits,
    number_flag,
    output_file,
)
from exporter.cli.plan_fleet import (
    DEFAULT_SHAPE,
    add_fleet_arguments,
    fleet_problem,
    run_fleet_plan,
)
from exporter.cli.plan_state import Calibrated, distance, print_evidence, read_state
from exporter.config.checks import KeyReader
from exporter.config.slo import parse_slo
from exporter.config.values import SloConfig
from exporter.sizing.feasibility import prefill_step_ms, single_targets
from exporter.sizing.slo_targets import PredictedPercentile, predicted_percentiles
from model import (
    DEFAULT_MODEL,
    LatencyMetric,
    ServerConfig,
    ServiceParams,
    SloCapacity,
    Workload,
    analyze,
    latency_quantiles,
    max_rate_for_slo,
)
from model.queueing.analyzer import MAX_RATE_FRACTION
from model.queueing.chain import workload_table
from model.queueing.sizing import ReplicaPlan, plan_replicas

# Paper Table I (H100, ms): presets for --model.
PRESETS = {
    "llama-3.1-8b-h100": ServiceParams(6.68, 2.01e-2, 5.52e-5),
    "qwen2.5-14b-h100": ServiceParams(10.14, 3.68e-2, 8.48e-5),
}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `plan` subcommand."""
    plan = sub.add_parser(
        "plan",
        help="latency vs load and replicas needed, for given parameters",
        description="Print one replica's TTFT and ITL as its load grows and the replicas a range "
        "of total loads needs for the targets, from given alpha, beta, gamma (a preset of paper "
        "Table I, or your own); --png draws both. With --config: the cheapest mix of a "
        "configured model's variants for --rate.",
    )
    param = number_flag(0.0, MAX_PARAM_MS, low_inclusive=False)
    target = number_flag(0.0, MAX_TARGET_MS, low_inclusive=False)
    preset = plan.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="llama-3.1-8b-h100",
        help="alpha, beta, gamma measured in paper Table I",
    )
    add_renamed_flag(plan, "--model", preset)
    plan.add_argument(
        "--alpha-ms", type=param, help="per-iteration overhead, ms (overrides the preset)"
    )
    plan.add_argument(
        "--beta-ms", type=param, help="compute time per token, ms (overrides the preset)"
    )
    plan.add_argument(
        "--gamma-ms", type=param, help="KV read time per cached token, ms (overrides the preset)"
    )
    plan.add_argument(
        "--input-tokens", type=number_flag(0.0, MAX_TOKENS),
        help=f"mean prompt length (default: --state's, else {DEFAULT_SHAPE.avg_input_tokens:g})",
    )
    plan.add_argument(
        "--output-tokens", type=number_flag(1.0, MAX_TOKENS),
        help=f"mean output length (default: --state's, else {DEFAULT_SHAPE.avg_output_tokens:g})",
    )
    add_server_limits(plan)
    plan.add_argument(
        "--ttft-ms", type=target, help="TTFT target, ms (without targets: size to saturation)"
    )
    plan.add_argument("--itl-ms", type=target, help="ITL target, ms (token-weighted mean)")
    plan.add_argument(
        "--slo",
        type=_slo_entry,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a percentile target in the configuration's spelling, repeatable: ttft.p95_ms=500, "
        "itl.p99_ms=80, itl.kind=per_request",
    )
    plan.add_argument(
        "--max-replicas", type=int, default=10, metavar="N",
        help="replicas.max: a target is said infeasible at a load only when N replicas cannot "
        "meet it there (default 10)",
    )
    plan.add_argument(
        "--load",
        type=number_flag(0.0, MAX_TOTAL_RPS),
        nargs=2,
        metavar=("MIN_RPS", "MAX_RPS"),
        help="total load range for the replica table, req/s (default: 0.5x to 4x one "
        "replica's SLO capacity)",
    )
    plan.add_argument(
        "--png", type=output_file, help="write latency-vs-load and replicas curves here"
    )
    add_fleet_arguments(plan)
    plan.add_argument(
        "--deployment", metavar="NAME", help="the deployment in --state (default: its only one)"
    )
    plan.set_defaults(func=run_plan, check=_check_plan)


def _slo_entry(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or "." not in key:
        raise argparse.ArgumentTypeError(
            f"must be SECTION.KEY=VALUE (ttft.p95_ms=500), got {text!r}"
        )
    return key, value


def _check_plan(args: argparse.Namespace) -> str | None:
    fleet = fleet_problem(args)
    if fleet is not None:
        return fleet
    if args.max_replicas < 1:
        return f"argument --max-replicas: must be an integer >= 1, got {args.max_replicas}"
    if args.load is not None and args.load[0] > args.load[1]:
        return f"argument --load: MIN_RPS must be <= MAX_RPS, got {args.load[0]:g} {args.load[1]:g}"
    sections: dict[str, dict[str, object]] = {}
    for key, value in args.slo:
        section, _, name = key.partition(".")
        try:
            number: object = float(value)
        except ValueError:
            number = value
        sections.setdefault(section, {})[name] = number
    reader = KeyReader()
    means = {"ttft_ms": args.ttft_ms, "itl_ms": args.itl_ms}
    args.targets = parse_slo(reader, {"slo": {**means, **sections}}, "")
    if reader.problems:
        return f"argument --slo: {'; '.join(reader.problems)}"
    return None


def _params(args: argparse.Namespace, calibrated: Calibrated | None = None) -> ServiceParams:
    base = PRESETS[args.preset]
    if calibrated is not None:
        if calibrated.params is None:
            raise ValueError(f"deployment {calibrated.name!r} has no calibrated parameters yet")
        base = calibrated.params
    return ServiceParams(
        args.alpha_ms if args.alpha_ms is not None else base.alpha_ms,
        args.beta_ms if args.beta_ms is not None else base.beta_ms,
        args.gamma_ms if args.gamma_ms is not None else base.gamma_ms,
    )


def run_plan(args: argparse.Namespace) -> int:
    if args.config is not None:  # the cheapest mix of a configured model's variants
        return run_fleet_plan(args, args.targets)
    try:
        calibrated = None if args.state is None else read_state(args.state, args.deployment)
        params = _params(args, calibrated)
        shape = (calibrated and calibrated.workload) or DEFAULT_SHAPE
        workload = Workload(
            shape.avg_input_tokens if args.input_tokens is None else args.input_tokens,
            shape.avg_output_tokens if args.output_tokens is None else args.output_tokens,
        )
        server = ServerConfig(args.max_num_seqs, args.max_num_batched_tokens)
        slo: SloConfig = args.targets
        capacity = max_rate_for_slo(
            params, server, workload, slo.ttft_ms, slo.itl_ms, percentiles=slo.percentiles
        )
    except ValueError as exc:
        print(f"vllm-sizer plan: {exc}", file=sys.stderr)
        return 2
    print(
        f"parameters (ms): alpha={params.alpha_ms:g} beta={params.beta_ms:g} "
        f"gamma={params.gamma_ms:g}; request {workload.avg_input_tokens:g} in / "
        f"{workload.avg_output_tokens:g} out; B={server.max_batch_size} "
        f"M={server.max_num_batched_tokens}"
    )
    saturation = capacity.max_rate_rps / MAX_RATE_FRACTION
    if slo.ttft_ms is None and slo.itl_ms is None and not slo.percentiles:
        print(
            f"one replica: saturates at {saturation:.4g} req/s; no --ttft-ms or --itl-ms given, "
            f"so sized to saturation capacity: {capacity.rate_rps:.4g} req/s "
            f"({MAX_RATE_FRACTION:.1%} of saturation; latency is not bounded)"
        )
    else:
        print(
            f"one replica: saturates at {saturation:.4g} req/s; SLO capacity "
            f"{capacity.rate_rps:.4g} req/s ({capacity.binding_name}: {capacity.message})"
        )
    env = (
        None if calibrated is None
        else print_evidence(calibrated, slo, capacity.rate_rps, saturation)
    )  # fmt: skip
    alone = _target_capacities(params, server, workload, slo)
    rates = np.linspace(0.0, capacity.max_rate_rps, 11)[1:]
    curve = analyze(params, server, workload, rates)
    names = "".join(f" | {t.name} ms" for t in slo.percentiles)
    beyond = "" if env is None else " | extrapolation"
    print(f"\nper replica: rate req/s | TTFT ms | ITL ms | batch | wait ms{names}{beyond}")
    for k, rate in enumerate(rates):
        tails = _percentile_cells(slo, params, server, workload, float(rate))
        print(
            f"  {rate:10.4g} | {curve.ttft_ms[k]:9.2f} | {curve.itl_ms[k]:7.2f} | "
            f"{curve.avg_batch_size[k]:6.1f} | {curve.avg_wait_ms[k]:8.2f}{tails}"
            f"{distance(env, float(rate))}"
        )
    if capacity.feasible:
        low, high = args.load or (0.5 * capacity.rate_rps, 4.0 * capacity.rate_rps)
        loads = np.unique(np.linspace(low, high, 8))  # one row when MIN_RPS = MAX_RPS
        print(f"\ntotal load req/s | replicas | per-replica TTFT ms | ITL ms{names}")
        for load in loads:
            plan = _replicas(params, server, workload, capacity, float(load))
            assert plan.replicas is not None and plan.per_replica_rate_rps is not None
            tails = _percentile_cells(slo, params, server, workload, plan.per_replica_rate_rps)
            missed = [n for n, rate in alone.items() if rate * args.max_replicas < load]
            note = f"  infeasible at {args.max_replicas} replicas: {','.join(missed)}"
            print(
                f"  {load:14.4g} | {plan.replicas:8d} | {plan.ttft_ms:19.2f} | "
                f"{plan.itl_ms:6.2f}{tails}{note if missed else ''}"
            )
    if args.png:
        _plot_plan(args.png, params, server, workload, capacity, slo)
        print(f"\nwrote {args.png}")
    return 0


def _target_capacities(
    params: ServiceParams, server: ServerConfig, workload: Workload, slo: SloConfig
) -> dict[str, float]:
    """One replica's SLO capacity for each target alone (req/s; 0: not met at any load), each
    printed, with what sets a per-token ITL tail the prefill steps reach."""
    out: dict[str, float] = {}
    if len(single_targets(slo)) > 1:
        print("each target alone:")
    step_ms = prefill_step_ms(params, server, workload)
    for name, alone in single_targets(slo):
        cap = max_rate_for_slo(
            params, server, workload, alone.ttft_ms, alone.itl_ms, percentiles=alone.percentiles
        )
        out[name] = cap.rate_rps if cap.feasible else 0.0
        line = f"  {name}: {out[name]:.4g} req/s per replica"
        (target,) = alone.percentiles or (None,)
        if target is not None and target.metric is LatencyMetric.ITL_PER_TOKEN:
            if step_ms > target.target_ms:
                line += (
                    f"; a step carrying a prefill chunk lasts about {step_ms:.3g} ms (alpha + "
                    f"beta x the prompt), above the target: it holds only while fewer than "
                    f"{1 - target.quantile:.2%} of the gaps fall in such steps, so its "
                    "capacity is set by prefill interleaving, not by queueing"
                )
        if len(single_targets(slo)) > 1 or line.count(";"):
            print(line)
    return out


def _replicas(
    params: ServiceParams,
    server: ServerConfig,
    workload: Workload,
    capacity: SloCapacity,
    total_rps: float,
) -> ReplicaPlan:
    """Replicas for a total load given one replica's SLO capacity (found once, not per load)."""
    table = workload_table(params, server, workload, options=DEFAULT_MODEL)
    return plan_replicas(table, capacity, total_rps, 1, None)


def _percentile_cells(
    slo: SloConfig, params: ServiceParams, server: ServerConfig, workload: Workload, rate: float
) -> str:
    found: tuple[PredictedPercentile, ...] = predicted_percentiles(
        slo.percentiles, params, server, workload, rate, DEFAULT_MODEL
    )
    return "".join(f" | {p.value_ms:{len(p.target.name) + 3}.2f}" for p in found)


def _plot_plan(
    path: Path,
    params: ServiceParams,
    server: ServerConfig,
    workload: Workload,
    capacity: SloCapacity,
    slo: SloConfig,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from exporter.base.plot_axes import integer_ticks, plain_log_ticks

    top_rps = capacity.max_rate_rps
    rates = np.linspace(0.0, top_rps, 400)
    curve = analyze(params, server, workload, rates)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    curves = [("TTFT", curve.ttft_ms, slo.ttft_ms), ("ITL", curve.itl_ms, slo.itl_ms)]
    if slo.percentiles:
        found = latency_quantiles(
            params, server, workload, rates, sorted({t.quantile for t in slo.percentiles})
        )
        columns = {
            LatencyMetric.TTFT: found.ttft_ms,
            LatencyMetric.ITL_PER_TOKEN: found.itl_per_token_ms,
            LatencyMetric.ITL_PER_REQUEST: found.itl_per_request_ms,
        }
        quantiles = list(found.quantiles)
        curves += [
            (t.name, columns[t.metric][:, quantiles.index(t.quantile)], t.target_ms)
            for t in slo.percentiles
        ]
    for name, values, target in curves:
        (line,) = left.plot(rates, values, label=name)
        if target:
            left.axhline(
                target, color=line.get_color(), linestyle="--", linewidth=1, label=f"{name} target"
            )
    left.set(
        xlabel="rate per replica (req/s)",
        ylabel="ms",
        yscale="log",
        title="latency vs load, one replica",
    )
    plain_log_ticks(left)
    left.legend()
    loads = np.linspace(0.0, 6.0 * top_rps, 200)
    counts = [_replicas(params, server, workload, capacity, float(x)).replicas or 0 for x in loads]
    right.step(loads, counts, where="post")
    right.set(xlabel="total load (req/s)", ylabel="replicas", title="replicas for the targets")
    integer_ticks(right)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
