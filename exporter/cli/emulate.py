"""`vllm-sizer emulate`: serve emulated vLLM replicas on 127.0.0.1 for a time or until stopped."""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time

import numpy as np

from exporter.cli.emulate_variants import add_variant_options, check_variants, variant_specs
from exporter.cli.fleet_options import (
    MAX_DURATION_S,
    MAX_RATE_RPS,
    MAX_TIME_SCALE,
    add_fleet_options,
    add_renamed_flag,
    check_traffic_options,
    int_flag,
    number_flag,
    parse_fleet_options,
    parse_traffic_options,
)
from exporter.testbed.emulator import DEFAULT_KV_CAPACITY_TOKENS, EmulatedFleet
from exporter.testbed.mixed_emulator import PORTS_PER_VARIANT, MixedEmulatedFleet
from model.simulation.mixed import FleetRouting
from model.simulation.simulator import Router
from model.simulation.workloads import RateProfile

STATUS_PERIOD_S = 10.0
MODULATED_S = 7 * 86_400.0  # simulated time the modulated rate covers; its last rate holds after


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `emulate` subcommand."""
    emu = subparsers.add_parser(
        "emulate", help="serve emulated vLLM replicas on 127.0.0.1",
        description="Serve emulated vLLM replicas on 127.0.0.1, each a real-time simulation of "
                    "vLLM's scheduler behind vLLM's own /metrics (served model name: "
                    "--model-name), for a daemon or a Prometheus server to read. Prints each "
                    "replica's /metrics URL, then a status line every 10 s.")
    add_fleet_options(emu)
    emu.add_argument("--rate-rps", type=number_flag(0.0, MAX_RATE_RPS), default=5.0,
                     help="arrival rate of the whole fleet (not per replica), req/s; each "
                          "request goes to one replica (--router)")
    emu.add_argument("--time-scale", type=number_flag(0.0, MAX_TIME_SCALE, low_inclusive=False),
                     default=1.0, help="simulated seconds per wall second")
    emu.add_argument("--base-port", type=int_flag(1, 65535),
                     help="replica i listens on 127.0.0.1:BASE_PORT+i (default: any free port)")
    emu.add_argument("--model-name", default="emulated",
                     help="served model name: the model_name label of the metrics")
    stop = emu.add_argument("--stop-after-s", type=number_flag(0.0, MAX_DURATION_S), default=0.0,
                            help="wall seconds to serve, then exit (0: until interrupted)")
    add_renamed_flag(emu, "--duration-s", stop)
    add_variant_options(emu)
    emu.set_defaults(func=_run_emulate, check=_check_emulate)


def _check_emulate(args: argparse.Namespace) -> str | None:
    traffic_problem = check_traffic_options(args)
    if traffic_problem is not None:
        return traffic_problem
    if args.variant:
        problem = check_variants(args.variant)
        if problem is None and args.base_port is not None:
            top = args.base_port + PORTS_PER_VARIANT * len(args.variant) - 1
            if top > 65535:
                problem = (f"argument --base-port: each --variant takes {PORTS_PER_VARIANT} "
                           f"ports: must be <= {65536 - PORTS_PER_VARIANT * len(args.variant)}, "
                           f"got {args.base_port}")
        return problem
    if args.base_port is not None and args.base_port + args.replicas - 1 > 65535:
        return (f"argument --base-port: must be <= {65536 - args.replicas} for "
                f"{args.replicas} replicas, got {args.base_port}")
    return None


def _run_emulate(args: argparse.Namespace) -> int:
    """Serve emulated vLLM replicas (one /metrics each on 127.0.0.1) until interrupted."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        params, server, n_in, n_out = parse_fleet_options(args)
        traffic = parse_traffic_options(args)
        rng = np.random.default_rng(args.seed)
        arrivals: RateProfile | float = args.rate_rps
        if args.paper_profile is not None:
            arrivals = RateProfile.paper(args.paper_profile)
        elif traffic.burst_ratio != 1.0 and args.rate_rps > 0:
            arrivals = traffic.profile(args.rate_rps, MODULATED_S, rng)
        common = dict(
            rng=rng, arrivals=arrivals, input_lengths=n_in, output_lengths=n_out,
            interarrival_cv=args.interarrival_cv, pairs=traffic.pairs,
            prefix_hit_share=traffic.prefix_hit_share, model_name=args.model_name,
            time_scale=args.time_scale, base_port=args.base_port,
        )
        fleet: EmulatedFleet
        if args.variant:
            specs, replicas, weights = variant_specs(args.variant, args.truth_model, server)
            fleet = MixedEmulatedFleet(specs, replicas=replicas, weights=weights,
                                       routing=FleetRouting(args.routing), **common)
        else:
            fleet = EmulatedFleet(
                params, server, replicas=args.replicas, router=Router(args.router),
                kv_capacity_tokens=args.kv_capacity_tokens or DEFAULT_KV_CAPACITY_TOKENS,
                **common,
            )
    except ValueError as exc:
        print(f"vllm-sizer emulate: {exc}", file=sys.stderr)
        return 2
    done = threading.Event()
    began = time.monotonic()
    try:
        fleet.start()
    except OSError as exc:
        fleet.stop()  # the replicas that did start
        where = "" if args.base_port is None else f"--base-port {args.base_port}: "
        print(f"vllm-sizer emulate: {where}cannot listen ({exc.strerror or exc})", file=sys.stderr)
        return 2
    try:
        if isinstance(fleet, MixedEmulatedFleet):
            for variant, urls in fleet.urls_by_variant().items():
                for url in urls:
                    print(f"{url} {variant}", flush=True)
        else:
            for url in fleet.urls:
                print(url, flush=True)
        try:
            while fleet.error is None:
                left_s = args.stop_after_s - (time.monotonic() - began)
                if args.stop_after_s > 0 and left_s <= 0:
                    break
                done.wait(STATUS_PERIOD_S if args.stop_after_s <= 0
                          else min(STATUS_PERIOD_S, left_s))
                stats = fleet.stats()
                print(f"sim {stats.sim_time_s:8.1f} s  replicas {len(fleet.urls)}  late ticks "
                      f"{stats.behind_ticks}", flush=True)
        except KeyboardInterrupt:
            pass
    finally:
        fleet.stop()
    return 1 if fleet.error is not None else 0
