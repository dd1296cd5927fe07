"""Subcommands `vllm-sizer simulate` (latency percentiles per rate from the simulator, with CSV)
and `vllm-sizer emulate` (serve emulated vLLM replicas). Style §6; issue 4."""

from __future__ import annotations

import argparse
import csv
import logging
import math
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from exporter.emulation.emulator import DEFAULT_KV_CAPACITY_TOKENS, EmulatedFleet
from model.queueing.params import ServerConfig, ServiceParams
from model.simulation.simulator import Router, Simulator
from model.simulation.workloads import LengthDist, LengthKind, RateProfile, RequestTrace, draw_trace

# Paper Table I, Llama-3.1-8B on H100 (ms).
DEFAULT_PARAMS = ServiceParams(alpha_ms=6.68, beta_ms=2.01e-2, gamma_ms=5.52e-5)
PERCENTILES = (50, 90, 99)
STATUS_PERIOD_S = 10.0


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
    """Add the `simulate` and `emulate` subcommands."""
    sim = subparsers.add_parser("simulate", help="simulate vLLM replicas under a load",
                                description=_run_simulate.__doc__)
    _add_common(sim)
    sim.add_argument("--rates", default="1,2,4,8", help="comma-separated Poisson rates, req/s")
    sim.add_argument("--duration-s", type=float, default=600.0, help="arrivals per rate, s")
    sim.add_argument("--warmup-s", type=float, default=60.0, help="arrivals ignored at start, s")
    sim.add_argument("--csv", type=Path, help="write the table as CSV here")
    sim.add_argument("--trace", type=Path,
                     help="replay requests from a CSV (arrival_s, input_tokens, output_tokens)")
    sim.set_defaults(func=_run_simulate)
    emu = subparsers.add_parser("emulate", help="serve emulated vLLM replicas on 127.0.0.1",
                                description=_run_emulate.__doc__)
    _add_common(emu)
    emu.add_argument("--rate-rps", type=float, default=5.0, help="Poisson arrival rate, req/s")
    emu.add_argument("--time-scale", type=float, default=1.0, help="simulated s per wall s")
    emu.add_argument("--startup-delay-s", type=float, default=0.0, help="new replica start, s")
    emu.add_argument("--base-port", type=int, help="replica i listens on BASE+i (default: any)")
    emu.add_argument("--model-name", default="emulated", help="the model_name label")
    emu.add_argument("--duration-s", type=float, default=0.0, help="wall s to run (0: forever)")
    emu.set_defaults(func=_run_emulate)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--alpha-ms", type=float, default=DEFAULT_PARAMS.alpha_ms)
    p.add_argument("--beta-ms", type=float, default=DEFAULT_PARAMS.beta_ms)
    p.add_argument("--gamma-ms", type=float, default=DEFAULT_PARAMS.gamma_ms)
    p.add_argument("--max-batch-size", type=int, default=256, help="vLLM max_num_seqs")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-queue-size", type=int, help="reject arrivals beyond this queue")
    p.add_argument("--input-tokens", type=float, default=1024.0, help="mean prompt length")
    p.add_argument("--output-tokens", type=float, default=512.0, help="mean output length")
    p.add_argument("--lengths", choices=[k.value for k in LengthKind if k != LengthKind.EMPIRICAL],
                   default=LengthKind.UNIFORM.value, help="length law (uniform: [x/2, 3x/2])")
    p.add_argument("--length-cv", type=float, default=0.5, help="CV of the lognormal law")
    p.add_argument("--interarrival-cv", type=float, default=1.0, help="0 constant, 1 Poisson")
    p.add_argument("--paper-profile", type=float, metavar="BASE_RPS",
                   help="the paper's 44-minute ramp (Table IV) from this baseline instead")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--router", choices=[r.value for r in Router], default=Router.LEAST_LOADED.value)
    p.add_argument("--kv-capacity-tokens", type=int, help="KV cache per replica, tokens")
    p.add_argument("--seed", type=int, default=0)


def _setup(args: argparse.Namespace) -> tuple[ServiceParams, ServerConfig, LengthDist, LengthDist]:
    params = ServiceParams(args.alpha_ms, args.beta_ms, args.gamma_ms)
    server = ServerConfig(args.max_batch_size, args.max_num_batched_tokens, args.max_queue_size)
    kind = LengthKind(args.lengths)
    return (
        params,
        server,
        LengthDist(kind, args.input_tokens, cv=args.length_cv),
        LengthDist(kind, args.output_tokens, cv=args.length_cv),
    )


def _run_simulate(args: argparse.Namespace) -> int:
    """Simulate each load on fresh replicas and print mean and p50/p90/p99 TTFT and ITL (ms)."""
    try:
        params, server, n_in, n_out = _setup(args)
        loads = _loads(args, n_in, n_out)
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
    args: argparse.Namespace, n_in: LengthDist, n_out: LengthDist
) -> list[tuple[str, RequestTrace, float]]:
    """(label, requests, warm-up s) per load: a replayed trace, the paper profile, or rates."""
    if args.trace is not None:
        return [(args.trace.name, load_trace_csv(args.trace), 0.0)]
    if args.paper_profile is not None:
        profile = RateProfile.paper(args.paper_profile)
        trace = draw_trace(profile, n_in, n_out, np.random.default_rng(args.seed),
                           cv=args.interarrival_cv)
        return [("paper-profile", trace, 0.0)]
    out = []
    for rate in (float(x) for x in str(args.rates).split(",") if x.strip()):
        profile = RateProfile.constant(rate, args.duration_s)
        trace = draw_trace(profile, n_in, n_out, np.random.default_rng(args.seed),
                           duration_s=args.duration_s, cv=args.interarrival_cv)
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
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"{path}: a trace needs numeric columns arrival_s, input_tokens, output_tokens ({exc})"
        ) from exc
    order = np.argsort(arrival, kind="stable")
    return RequestTrace(arrival[order], n_in[order], n_out[order])


def _summary(prefix: str, values: NDArray[np.float64]) -> dict[str, float]:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        nan = {f"{prefix}_p{q}_ms": math.nan for q in PERCENTILES}
        return {f"{prefix}_mean_ms": math.nan} | nan
    out = {f"{prefix}_mean_ms": float(finite.mean())}
    for q, v in zip(PERCENTILES, np.percentile(finite, PERCENTILES), strict=True):
        out[f"{prefix}_p{q}_ms"] = float(v)
    return out


def _run_emulate(args: argparse.Namespace) -> int:
    """Serve emulated vLLM replicas (one /metrics each on 127.0.0.1) until interrupted."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        params, server, n_in, n_out = _setup(args)
        arrivals = (RateProfile.paper(args.paper_profile) if args.paper_profile is not None
                    else args.rate_rps)
        fleet = EmulatedFleet(
            params, server, rng=np.random.default_rng(args.seed), arrivals=arrivals,
            input_lengths=n_in, output_lengths=n_out, interarrival_cv=args.interarrival_cv,
            model_name=args.model_name, replicas=args.replicas, time_scale=args.time_scale,
            startup_delay_s=args.startup_delay_s, router=Router(args.router),
            kv_capacity_tokens=args.kv_capacity_tokens or DEFAULT_KV_CAPACITY_TOKENS,
            base_port=args.base_port,
        )
    except ValueError as exc:
        print(f"vllm-sizer emulate: {exc}", file=sys.stderr)
        return 2
    done = threading.Event()
    began = time.monotonic()
    with fleet:
        for url in fleet.urls:
            print(url, flush=True)
        try:
            while fleet.error is None:
                left_s = args.duration_s - (time.monotonic() - began)
                if args.duration_s > 0 and left_s <= 0:
                    break
                done.wait(STATUS_PERIOD_S if args.duration_s <= 0 else min(STATUS_PERIOD_S, left_s))
                stats = fleet.stats()
                print(f"sim {stats.sim_time_s:8.1f} s  replicas {len(fleet.urls)}  late ticks "
                      f"{stats.behind_ticks}", flush=True)
        except KeyboardInterrupt:
            pass
    return 1 if fleet.error is not None else 0
