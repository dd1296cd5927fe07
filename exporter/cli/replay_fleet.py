"""`vllm-sizer replay --config fleet.yaml`: a mixed fleet's replay.

With a config holding a `fleet:` section (exporter/replay/fleet_setup.py), `replay` replays the
trace on each model's mixed fleet under the fleet policies (ours, best_single, greedy_kv,
oracle; --policy is not read), prints one row per policy and writes fleet.json and fleet.png
(exporter/replay/fleet_report.py) in --out. Each request goes to one model, drawn by the
models' shares (--seed)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable

import numpy as np

from exporter.base.errors import ConfigError
from exporter.cli.fleet_options import output_file
from exporter.replay.engine import ArrivalSource
from exporter.replay.fleet_report import plot_fleet
from exporter.replay.fleet_run import fleet_json, fleet_table, run_policy, standard_policies
from exporter.replay.fleet_setup import FleetSetup, load_fleet
from exporter.replay.report import json_safe
from model.simulation.workloads import RequestTrace

Arrivals = Callable[[np.random.Generator], ArrivalSource]


def split_by_share(trace: RequestTrace, setup: FleetSetup, rng: np.random.Generator
                   ) -> dict[str, RequestTrace]:
    """Each request to one model with probability its share (none when the shares fall
    short of 1)."""
    shares = np.array([m.share for m in setup.models])
    edges = np.cumsum(shares)
    draw = rng.random(len(trace))
    which = np.searchsorted(edges, draw, side="right")
    out = {}
    for k, m in enumerate(setup.models):
        keep = which == k
        out[m.name] = RequestTrace(trace.arrival_s[keep], trace.input_tokens[keep],
                                   trace.output_tokens[keep])
    return out


def run_fleet_replay(args: argparse.Namespace, arrivals: Arrivals) -> int:
    """Replay, print the table, write fleet.json and fleet.png; 2 on bad input."""
    try:
        setup = load_fleet(args.config)
        rng = np.random.default_rng(args.seed)
        whole = arrivals(rng).until(math.inf)
        if len(whole) == 0:
            raise ValueError("the trace holds no request in the chosen window")
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            output_file(str(args.out / "fleet.json"))
    except (ConfigError, OSError, ValueError, KeyError, argparse.ArgumentTypeError) as exc:
        print(f"vllm-sizer replay: {exc}", file=sys.stderr)
        return 2
    traces = split_by_share(whole, setup, rng)
    windows = max(1, math.ceil(float(whole.arrival_s[-1]) / setup.window_s))
    scores = [run_policy(setup, policy, traces, windows)
              for policy in standard_policies(setup, traces, windows)]
    print(f"{len(whole)} requests, {windows} windows of {setup.window_s:g} s, judged from "
          f"{setup.judged_from_s:g} s; cost in price units")
    print(fleet_table(setup, scores), end="")
    if args.out is not None:
        report = fleet_json(setup, scores, windows) | {"arrivals": len(whole)}
        (args.out / "fleet.json").write_text(json.dumps(json_safe(report), indent=1) + "\n")
        plot_fleet(json_safe(report), args.out / "fleet.png",
                   f"fleet replay of {len(whole)} requests, {windows} windows")
    return 0
