"""`vllm-sizer simulate`: latency percentiles per load from the simulator, optionally as CSV."""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from exporter.cli.fleet_options import (
    MAX_DURATION_S,
    MAX_RATE_RPS,
    TrafficOptions,
    add_fleet_options,
    check_traffic_options,
    input_file,
    number_flag,
    output_file,
    parse_fleet_options,
    parse_traffic_options,
)
from model.simulation.simulator import Router, Simulator
from model.simulation.workloads import LengthDist, RateProfile, RequestTrace, draw_trace

PERCENTILES = (50, 90, 99)
# Expected requests, and prefill iterations, of one load: a million take about a minute and a
# few hundred MiB.
MAX_WORK = 1_000_000
MAX_RATES = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class RateRow:
    """Latency summary (ms) of one simulated load, over requests that arrived after warm-up."""

    load: str
    requests: int
    completed: int
    ttft_mean_ms: float
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    itl_mean_ms: float
    itl_p50_ms: float
    itl_p90_ms: float
    itl_p99_ms: float
    wall_s: float


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `simulate` subcommand."""
    sim = subparsers.add_parser("simulate", help="simulate vLLM replicas under a load",
                                description=_run_simulate.__doc__)
    add_fleet_options(sim)
    sim.add_argument("--rates", type=_rates, default="1,2,4,8",
                     help="comma-separated arrival rates of the whole fleet, req/s, one run each")
    sim.add_argument("--duration-s", type=number_flag(0.0, MAX_DURATION_S, low_inclusive=False),
                     default=600.0, help="simulated seconds of arrivals at each rate")
    sim.add_argument("--warmup-s", type=number_flag(0.0, MAX_DURATION_S), default=60.0,
                     help="simulated seconds at the start of each rate whose arrivals the "
                          "statistics leave out")
    sim.add_argument("--csv", type=output_file, help="write the table as CSV here")
    sim.add_argument("--trace", type=input_file,
                     help="replay requests from a CSV (arrival_s, input_tokens, output_tokens)")
    sim.set_defaults(func=_run_simulate, check=_check_simulate)


def _rates(text: str) -> tuple[float, ...]:
    """--rates: up to MAX_RATES comma-separated rates in (0, MAX_RATE_RPS]."""
    rate = number_flag(0.0, MAX_RATE_RPS, low_inclusive=False)
    rates = tuple(rate(x) for x in text.split(",") if x.strip())
    if not rates or len(rates) > MAX_RATES:
        raise argparse.ArgumentTypeError(f"must list 1 to {MAX_RATES} rates, got {len(rates)}")
    return rates


def _check_simulate(args: argparse.Namespace) -> str | None:
    """Flags that bound each other: warm-up within the duration, and the work of one load (its
    expected requests, and the prefill iterations of their prompts)."""
    if args.trace is not None:
        return None
    traffic_problem = check_traffic_options(args)
    if traffic_problem is not None:
        return traffic_problem
    if args.paper_profile is not None:
        profile = RateProfile.paper(args.paper_profile)
        requests, flag = float(profile.cumulative(profile.duration_s)), "--paper-profile"
    elif args.warmup_s >= args.duration_s:
        return (f"argument --warmup-s: must be < --duration-s ({args.duration_s:g}), "
                f"got {args.warmup_s:g}")
    else:
        requests, flag = max(args.rates) * args.duration_s, "--duration-s"
    if requests > MAX_WORK:
        return f"argument {flag}: a load draws {requests:.3g} requests, more than {MAX_WORK}"
    chunks = math.ceil(args.input_tokens / args.max_num_batched_tokens)
    if requests * chunks > MAX_WORK:
        return (f"argument --max-num-batched-tokens: a mean prompt takes {chunks} prefill "
                f"iterations at this budget; {requests:.3g} requests take more than {MAX_WORK}")
    return None


def _run_simulate(args: argparse.Namespace) -> int:
    """Simulate each load on fresh replicas and print mean and p50/p90/p99 TTFT and ITL (ms)."""
    try:
        params, server, n_in, n_out = parse_fleet_options(args)
        loads = _loads(args, n_in, n_out, parse_traffic_options(args))
    except (ValueError, OSError) as exc:
        print(f"vllm-sizer simulate: {exc}", file=sys.stderr)
        return 2
    rows: list[RateRow] = []
    print(f"{'load':>14} {'reqs':>7} | TTFT ms: {'mean':>8} {'p50':>8} {'p90':>8} {'p99':>8} "
          f"| ITL ms: {'mean':>7} {'p50':>7} {'p90':>7} {'p99':>7} | wall s")
    for label, trace, warmup_s in loads:
        began = time.perf_counter()
        sim = Simulator(params, server, replicas=args.replicas, router=Router(args.router),
                        kv_capacity_tokens=args.kv_capacity_tokens)
        sim.add_requests(trace)
        res = sim.run()
        keep = res.arrival_s >= warmup_s
        ttft, itl = res.ttft_ms[keep], res.itl_ms[keep]
        row = RateRow(
            load=label, requests=int(keep.sum()), completed=res.completed,
            **_summary("ttft", ttft), **_summary("itl", itl),
            wall_s=time.perf_counter() - began,
        )
        rows.append(row)
        print(f"{row.load:>14} {row.requests:>7} | {'':8} {row.ttft_mean_ms:8.1f} "
              f"{row.ttft_p50_ms:8.1f} {row.ttft_p90_ms:8.1f} {row.ttft_p99_ms:8.1f} | {'':7} "
              f"{row.itl_mean_ms:7.2f} {row.itl_p50_ms:7.2f} {row.itl_p90_ms:7.2f} "
              f"{row.itl_p99_ms:7.2f} | {row.wall_s:6.2f}")
    if args.csv is not None:
        with args.csv.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(asdict(rows[0])))
            writer.writeheader()
            writer.writerows(asdict(r) for r in rows)
        print(f"wrote {args.csv}")
    return 0


def _loads(
    args: argparse.Namespace, n_in: LengthDist, n_out: LengthDist, traffic: TrafficOptions
) -> list[tuple[str, RequestTrace, float]]:
    """(label, requests, warm-up s) per load: a replayed trace, the paper profile, or rates."""
    if args.trace is not None:
        return [(args.trace.name, load_trace_csv(args.trace), 0.0)]
    if args.paper_profile is not None:
        profile = RateProfile.paper(args.paper_profile)
        trace = draw_trace(profile, n_in, n_out, np.random.default_rng(args.seed),
                           cv=args.interarrival_cv, pairs=traffic.pairs,
                           prefix_hit_share=traffic.prefix_hit_share)
        return [("paper-profile", trace, 0.0)]
    out = []
    for rate in args.rates:
        rng = np.random.default_rng(args.seed)
        profile = traffic.profile(rate, args.duration_s, rng)
        trace = draw_trace(profile, n_in, n_out, rng, duration_s=args.duration_s,
                           cv=args.interarrival_cv, pairs=traffic.pairs,
                           prefix_hit_share=traffic.prefix_hit_share)
        out.append((f"{rate:g}", trace, float(args.warmup_s)))
    return out


def load_trace_csv(path: Path) -> RequestTrace:
    """Requests from a CSV with columns arrival_s, input_tokens, output_tokens (any order of
    rows; sorted by arrival here)."""
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    try:
        arrival = np.array([float(r["arrival_s"]) for r in rows])
        n_in = np.array([int(r["input_tokens"]) for r in rows], dtype=np.int64)
        n_out = np.array([int(r["output_tokens"]) for r in rows], dtype=np.int64)
        order = np.argsort(arrival, kind="stable")
        return RequestTrace(arrival[order], n_in[order], n_out[order])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"argument --trace: {path}: needs numeric columns arrival_s, input_tokens, "
            f"output_tokens ({exc})"
        ) from exc


def _summary(prefix: str, values: NDArray[np.float64]) -> dict[str, float]:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        nan = {f"{prefix}_p{q}_ms": math.nan for q in PERCENTILES}
        return {f"{prefix}_mean_ms": math.nan} | nan
    out = {f"{prefix}_mean_ms": float(finite.mean())}
    for q, v in zip(PERCENTILES, np.percentile(finite, PERCENTILES), strict=True):
        out[f"{prefix}_p{q}_ms"] = float(v)
    return out
