"""Mixed fleets against the oracle and the peers' policies: four scenarios, each on the real
conversation trace (scaled) and on a synthetic trace, two seeds (exporter/replay/fleet_run.py).

Scenarios (Llama-3.1-8B unless said; truths from exporter/testbed/variant_truths.py):
  a  inventory_limited: L40S is the cheapest capacity but only 3 GPUs of it; H100 to spare.
  b  price_driven: short prompts; L40S and A100 cheaper per request than H100, all plentiful.
  c  two_models: Llama (priority 1) and Qwen2.5-14B (priority 0), half the requests each,
     competing for 3 H100s; A100s beside them.
  d  stationary: H100, A100 and L40S plentiful, on stationary traffic: plan changes after
     warm-up over a full hour (the real trace is one steady hour; its synthetic twin a
     constant-rate Poisson stream, not the diurnal one).

Traces: the conversation trace (`timestamp`, `input_length`, `output_length`; timestamps spread
over their 3 s quantum), prompts divided by PROMPT_DIVISOR (by 4 more in scenario b) for an 8B
model's context, its rate scaled by RATE_SCALE as independent users (a new draw per seed); the
synthetic trace a diurnal day compressed into the same span (rate from 30 % to 100 % of its
peak, Poisson), lengths drawn from the trace's (prompt, output) pairs. DURATION_S of each
(scenarios a-c, to keep the bench within 15 minutes on 2 shared cores), STATIONARY_S for d.

Per scenario the JSON also gives, over every variant of ours whose first replica became ready,
the longest and the median wait from then to trusted (the calibration confidence at or above
the trusted threshold), how many never were, and the capacity error of its prior (the
scaling rule's transfer) against the truth once trusted.

Per scenario the JSON gives ours' figures over its 4 runs (2 traces x 2 seeds):
`cost_ratio_vs_oracle` and `cost_ratio_vs_best_single` (mean of the per-run ratios, with the
worst), `met_share` (ours, judged windows meeting every target, pooled), `inventory_violations`
(ours, summed), `plan_changes_stationary` (ours, after warm-up, the most in one run); then
the oracle with foresight beside them (reported, not scored); every run's per-policy summary;
and ours once under `even` (planned for it, a round-robin
gateway) on the conversation trace's first seed, its cost over the weighted oracle's.
The conversation trace's first seed of each scenario is also drawn, as `vllm-sizer replay
--config` draws a fleet replay (exporter/replay/fleet_report.py).

    python bench/fleet.py  ->  bench/results/fleet.json, bench/results/fleet_<scenario>.png
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.lib.envelope import start_run, with_run  # noqa: E402
from exporter.cli.replay_fleet import split_by_share  # noqa: E402
from exporter.config.checks import KeyReader  # noqa: E402
from exporter.replay.fleet_policies import PlannerPolicy, TunerEstimates  # noqa: E402
from exporter.replay.fleet_report import plot_fleet  # noqa: E402
from exporter.replay.fleet_run import (  # noqa: E402
    PolicyScore,
    fleet_json,
    fleet_table,
    run_policy,
    standard_policies,
)
from exporter.replay.fleet_setup import FleetSetup, parse_fleet  # noqa: E402
from exporter.replay.report import json_safe  # noqa: E402
from exporter.replay.scaling import independent_users  # noqa: E402
from exporter.replay.trace import TraceReader, Transform  # noqa: E402
from exporter.sizing.fleet.values import Routing  # noqa: E402
from model.simulation.mixed import FleetRouting  # noqa: E402
from model.simulation.workloads import (  # noqa: E402
    ArrivalStream,
    RateProfile,
    RateSegment,
    RequestTrace,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TRACE = ROOT.parent / "shared" / "data" / "traces" / "mooncake-conversation.jsonl"
DURATION_S = 2400.0
STATIONARY_S = 3600.0  # scenario d: a stationary hour
RATE_SCALE = 3.0
PROMPT_DIVISOR = 4
SEEDS = (0, 1)
PRICES = {"H100": 4.0, "A100": 2.2, "L40S": 1.1}

LLAMA = {"name": "llama", "truth_model": "llama-3.1-8b", "slo": {"ttft_ms": 2000, "itl_ms": 60}}
QWEN = {"name": "qwen", "truth_model": "qwen2.5-14b", "slo": {"ttft_ms": 3000, "itl_ms": 80}}


def _v(model: str, kind: str, high: int, initial: int = 0) -> dict[str, Any]:
    return {"name": f"{model}-{kind.lower()}", "accelerator": kind, "max": high,
            "initial": initial}


SCENARIOS: dict[str, dict[str, Any]] = {
    "a_inventory_limited": {
        "inventory": {"H100": 8, "L40S": 3},
        "models": [LLAMA | {"variants": [_v("llama", "H100", 8, 1), _v("llama", "L40S", 3)]}],
    },
    "b_price_driven": {
        "inventory": {"H100": 8, "A100": 8, "L40S": 16},
        "prompt_divisor": 4,
        "models": [LLAMA | {"variants": [_v("llama", "H100", 8, 1), _v("llama", "A100", 8),
                                         _v("llama", "L40S", 16)]}],
    },
    "c_two_models": {
        "inventory": {"H100": 3, "A100": 12},
        "models": [
            LLAMA | {"priority": 1, "share": 0.5,
                     "variants": [_v("llama", "H100", 3, 1), _v("llama", "A100", 12)]},
            QWEN | {"priority": 0, "share": 0.5,
                    "variants": [_v("qwen", "H100", 3), _v("qwen", "A100", 12, 1)]},
        ],
    },
    "d_stationary": {
        "inventory": {"H100": 8, "A100": 8, "L40S": 16},
        "stationary": True,
        "duration_s": STATIONARY_S,
        "models": [LLAMA | {"variants": [_v("llama", "H100", 8, 1), _v("llama", "A100", 8),
                                         _v("llama", "L40S", 16)]}],
    },
}


def setup_of(spec: dict[str, Any]) -> FleetSetup:
    node = {
        "window_s": 30, "demand_margin": 0.25,
        "accelerators": {k: {"price_per_gpu_hour": PRICES[k], "inventory": n}
                         for k, n in spec["inventory"].items()},
        "models": spec["models"],
    }  # fmt: skip
    r = KeyReader()
    setup = parse_fleet(r, node, "fleet")
    if setup is None or r.problems:
        raise ValueError(r.problems)
    return setup


def real_trace(seed: int, duration_s: float = DURATION_S) -> RequestTrace:
    rng = np.random.default_rng(seed)
    with TraceReader(TRACE, rng=rng, transform=Transform(spread_s=3.0,
                                                         window_end_s=duration_s)) as reader:
        whole = reader.until(math.inf)
    return independent_users(whole, RATE_SCALE, duration_s, rng)


def synthetic_trace(seed: int, real: RequestTrace, stationary: bool,
                    duration_s: float = DURATION_S) -> RequestTrace:
    """Poisson arrivals on a compressed diurnal day (or a constant rate), lengths drawn from
    the real trace's pairs."""
    rng = np.random.default_rng(1000 + seed)
    mean = len(real) / duration_s
    if stationary:
        profile = RateProfile.constant(mean, duration_s)
    else:
        peak = mean / 0.65  # a sine from 30 % to 100 % of peak averages 65 %
        steps = 24
        rates = [peak * (0.65 - 0.35 * math.cos(2 * math.pi * k / steps)) for k in range(steps + 1)]
        profile = RateProfile(tuple(RateSegment(duration_s / steps, rates[k], rates[k + 1])
                                    for k in range(steps)))
    arrival = ArrivalStream(profile, rng).draw_until(duration_s)
    n = arrival.size
    pick = rng.integers(0, len(real), n)
    return RequestTrace(arrival, real.input_tokens[pick], real.output_tokens[pick])


def shrink(trace: RequestTrace, divisor: int) -> RequestTrace:
    return RequestTrace(trace.arrival_s, np.maximum(trace.input_tokens // divisor, 1),
                        trace.output_tokens)


def run_scenario(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    setup = setup_of(spec)
    divisor = PROMPT_DIVISOR * spec.get("prompt_divisor", 1)
    duration_s = spec.get("duration_s", DURATION_S)
    windows = int(duration_s // setup.window_s)
    runs: list[dict[str, Any]] = []
    for seed in SEEDS:
        real = shrink(real_trace(seed, duration_s), divisor)
        synthetic = synthetic_trace(seed, real, spec.get("stationary", False), duration_s)
        for kind, trace in (("conversation", real), ("synthetic", synthetic)):
            traces = split_by_share(trace, setup, np.random.default_rng(seed))
            began = time.process_time()
            policies = standard_policies(setup, traces, windows)
            scores = [run_policy(setup, p, traces, windows) for p in policies]
            ours = policies[0]
            assert isinstance(ours, PlannerPolicy) and ours.name == "ours"
            by = {s.name: s for s in scores}
            print(f"\n{name} / {kind} / seed {seed}: {len(trace)} requests, "
                  f"{time.process_time() - began:.1f} s CPU", flush=True)
            print(fleet_table(setup, scores), end="", flush=True)
            entry = {"trace": kind, "seed": seed, "requests": len(trace),
                     "policies": {s.name: s.summary() for s in scores}, **_ours(by),
                     "trust": {name: asdict(r) for name, r in ours.trust.items()}}
            if kind == "conversation" and seed == SEEDS[0]:
                entry["ours_even"] = _even(setup, traces, windows, by["oracle"])
                plot_fleet(json_safe(fleet_json(setup, scores, windows)),
                           RESULTS / f"fleet_{name}.png",
                           f"{name}: conversation trace, seed {seed}, {len(trace)} requests "
                           f"over {duration_s / 60:.0f} min")
            runs.append(entry)
    return {
        "duration_s": duration_s,
        "cost_ratio_vs_oracle": _mean(runs, "cost_ratio_vs_oracle"),
        "cost_ratio_vs_oracle_worst": max(r["cost_ratio_vs_oracle"] for r in runs),
        "cost_ratio_vs_best_single": _mean(runs, "cost_ratio_vs_best_single"),
        "cost_ratio_vs_best_single_worst": max(r["cost_ratio_vs_best_single"] for r in runs),
        "met_share": _pooled(runs, "ours"),
        "met_share_oracle": _pooled(runs, "oracle"),
        "met_share_best_single": _pooled(runs, "best_single"),
        "met_share_greedy_kv": _pooled(runs, "greedy_kv"),
        "met_share_oracle_foresight": _pooled(runs, "oracle_foresight"),
        "cost_ratio_vs_oracle_foresight": _mean(runs, "cost_ratio_vs_oracle_foresight"),
        "inventory_violations": sum(r["policies"]["ours"]["inventory_violations"] for r in runs),
        "plan_changes_stationary": max(r["policies"]["ours"]["plan_changes_after_warmup"]
                                       for r in runs),
        **_trust(runs),
        "ours_even_cost_ratio_vs_oracle": next(r["ours_even"]["cost_ratio_vs_oracle_weighted"]
                                               for r in runs if "ours_even" in r),
        "ours_even_met_share": next(r["ours_even"]["met_share"] for r in runs
                                    if "ours_even" in r),
        "runs": runs,
    }


def _even(setup: FleetSetup, traces: dict[str, RequestTrace], windows: int,
          oracle: PolicyScore) -> dict[str, Any]:
    """Ours planning for `even` routing behind an `even` (round-robin) gateway, against the
    oracle under weighted routing."""
    models = tuple(replace(m, routing=Routing.EVEN, gateway=FleetRouting.EVEN)
                   for m in setup.models)
    even = replace(setup, models=models)
    score = run_policy(even, PlannerPolicy("ours_even", even, TunerEstimates(even)), traces,
                       windows)
    print(f"ours under even routing: cost {score.cost:.2f} (oracle weighted "
          f"{oracle.cost:.2f}), met {score.met_share:.3f}", flush=True)
    return score.summary() | {"cost_ratio_vs_oracle_weighted": score.cost / oracle.cost
                              if oracle.cost else math.inf}


def _ours(by: dict[str, PolicyScore]) -> dict[str, float]:
    ours = by["ours"].cost
    ahead = by["oracle_foresight"].cost
    return {"cost_ratio_vs_oracle": ours / by["oracle"].cost if by["oracle"].cost else math.inf,
            "cost_ratio_vs_oracle_foresight": ours / ahead if ahead else math.inf,
            "cost_ratio_vs_best_single": ours / by["best_single"].cost
            if by["best_single"].cost else math.inf}


def _trust(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Over every variant of every run whose first replica became ready: the longest wait
    from then to trusted (s; a variant never trusted counts from its ready time to the end
    and is counted apart), and its prior's capacity error against the truth (worst absolute,
    and the median), once trusted."""
    waits, never, errors = [], 0, []
    for r in runs:
        for rec in r["trust"].values():
            if rec["trusted_s"] is None:
                never += 1
                continue
            waits.append(rec["trusted_s"] - rec["ready_s"])
            if rec["prior_vs_truth"] is not None:
                errors.append(rec["prior_vs_truth"])
    return {
        "trusted_after_ready_s_worst": max(waits, default=math.nan),
        "trusted_after_ready_s_median": float(np.median(waits)) if waits else math.nan,
        "never_trusted_after_ready": never,
        "prior_capacity_error_vs_truth_median": float(np.median(errors)) if errors else math.nan,
        "prior_capacity_error_vs_truth_worst": max(errors, key=abs, default=math.nan),
    }


def _mean(runs: list[dict[str, Any]], key: str) -> float:
    return float(np.mean([r[key] for r in runs]))


def _pooled(runs: list[dict[str, Any]], policy: str) -> float:
    met = sum(sum(r["policies"][policy]["met_windows"].values()) for r in runs)
    judged = sum(sum(r["policies"][policy]["judged_windows"].values()) for r in runs)
    return met / judged if judged else math.nan


def main() -> int:
    run = start_run()
    began = time.process_time()
    only = sys.argv[1:] or list(SCENARIOS)
    results = {name: run_scenario(name, SCENARIOS[name]) for name in only}
    print("\nscenario | ours/oracle | ours/best single | met ours | met oracle | met best "
          "single | met greedy | inventory violations | plan changes after warm-up")
    for name, r in results.items():
        print(f"{name} | {r['cost_ratio_vs_oracle']:.3f} | {r['cost_ratio_vs_best_single']:.3f} "
              f"| {r['met_share']:.3f} | {r['met_share_oracle']:.3f} | "
              f"{r['met_share_best_single']:.3f} | {r['met_share_greedy_kv']:.3f} | "
              f"{r['inventory_violations']} | {r['plan_changes_stationary']}")
    print("\nscenario | trusted after first ready, worst (median) s | never trusted | prior's "
          "capacity error vs truth, median (worst)")
    for name, r in results.items():
        print(f"{name} | {r['trusted_after_ready_s_worst']:.0f} "
              f"({r['trusted_after_ready_s_median']:.0f}) | {r['never_trusted_after_ready']} | "
              f"{r['prior_capacity_error_vs_truth_median']:+.3f} "
              f"({r['prior_capacity_error_vs_truth_worst']:+.3f})")
    cpu = time.process_time() - began
    print(f"\n{cpu:.0f} s CPU; load average {os.getloadavg()[0]:.1f}")
    out = with_run(run, {
        "settings": {"duration_s": DURATION_S, "stationary_duration_s": STATIONARY_S,
                     "rate_scale": RATE_SCALE,
                     "prompt_divisor": PROMPT_DIVISOR, "seeds": list(SEEDS),
                     "prices_per_gpu_hour": PRICES, "window_s": 30, "demand_margin": 0.25},
        "cpu_s": cpu,
        "scenarios": results,
    })  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    name = "fleet.json" if only == list(SCENARIOS) else "fleet-partial.json"
    (RESULTS / name).write_text(json.dumps(json_safe(out), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
