"""Closed-loop autoscaling on the simulated fleet: the paper's Table V, repeated over seeds
(issue 8 part 4).

The 44-minute load profile (Table IV) for both Table III scenarios and the TTFT-bound one with
lognormal CV 1 lengths (issue 17), true parameters = Table I Llama-3.1-8B, B = 256, M = 8192,
KV capacity 449,200 tokens per replica, lengths uniform on [x/2, 3x/2] (unless lognormal),
Poisson arrivals, 30 s windows, new replicas ready 90 s after they are asked for (removed ones
drain), one replica at the start and no known parameters. Arms:
- queueing: our Recommender fed by the Tuner, driven through the real `Daemon` cycle (steady
  window filter, per-replica rate, `waiting_queue_grows`, 300 s scale-down stabilization);
- throughput: the decode-throughput analyzer (paper §IX, Table II defaults);
- look-ahead: the queueing arm sizing for the rising trend 90 s ahead (`look_ahead_s`).
Each arm is one run of the replay engine (exporter/replay/engine.py, the engine of
`vllm-sizer replay`): each window is observed by a perfect collector
(exporter/replay/perfect.py), every arm sees the same requests (one trace per scenario and
seed), and its desired count is applied at the window's end as it is (no HPA in between). A
cycle is over an SLO when its window's mean TTFT (ITL) exceeds the target;
"outside loading" leaves out the windows in which a replica asked for was still starting;
"up-ramps" are the windows ending on a rising segment of Table IV or within 90 s after it.

Then the percentile scenario (bench/lib/closed_loop_percentiles.py: TTFT p95 and per-token ITL p99
targets; ours on them, ours on cost-matched mean targets, the throughput analyzer).

Writes bench/results/closed_loop.json, one PNG per scenario and seed, and
bench/results/closed_loop_percentiles.json (bench/results/).
Run: .venv/bin/python bench/closed_loop.py [--seeds N] [--scenario NAME] [--quick]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from dataclasses import asdict
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.lib.closed_loop_percentiles import PERCENTILE_SCENARIOS, run_percentile_scenarios  # noqa: E402
from bench.lib.closed_loop_report import (  # noqa: E402
    PAPER_TABLE_V,
    Cycle,
    Run,
    Scenario,
    plot_runs,
    print_combined,
    print_table,
    spread,
    table_columns,
)
from bench.lib.envelope import start_run, with_run  # noqa: E402
from exporter.config.values import DeploymentConfig, SloConfig, SourceConfig  # noqa: E402
from exporter.replay.arrivals import DrawnArrivals  # noqa: E402
from exporter.replay.engine import ApplyAsIs, Engine, FleetSettings  # noqa: E402
from exporter.replay.engine import Arm as EngineArm  # noqa: E402
from exporter.replay.exposition import PerfectObserver  # noqa: E402
from exporter.replay.perfect import KV_CAPACITY_TOKENS, window_gaps  # noqa: E402
from exporter.replay.policies import FixedPolicy, OursPolicy, ThroughputPolicy  # noqa: E402
from exporter.replay.report import json_safe  # noqa: E402
from model.queueing.params import ServerConfig, ServiceParams  # noqa: E402
from model.simulation.workloads import LengthDist, LengthKind, RateProfile, draw_trace  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent / "results"
LLAMA = ServiceParams(alpha_ms=6.68, beta_ms=2.01e-2, gamma_ms=5.52e-5)
SERVER = ServerConfig(max_batch_size=256, max_num_batched_tokens=8192)
WINDOW_S = 30.0
SAMPLE_S = 1.0  # gauge sampling period inside a window
STARTUP_DELAY_S = 90.0
LOOK_AHEAD_S = 90.0
MAX_JUMP_S = 1.0  # decode runs are cut so the gauges move smoothly
MAX_REPLICAS = 10
FIRST_SEED = 20261
DEFAULT_SEEDS = 5
QUICK_SECONDS = 1200.0  # --quick: the first 20 minutes (baseline, ramp, mid hold, ramp)
# Up-ramps of Table IV (s) and the startup delay after each: where look-ahead should help.
RAMP_UP_S = ((300.0, 480.0), (960.0, 1140.0))
FLEET = FleetSettings(
    params=LLAMA,
    server=SERVER,
    kv_capacity_tokens=KV_CAPACITY_TOKENS,
    startup_delay_s=STARTUP_DELAY_S,
    window_s=WINDOW_S,
    sample_s=SAMPLE_S,
    max_jump_s=MAX_JUMP_S,
)


SCENARIOS = (
    Scenario("ttft-bound", 300 / 60, 1024, 512, 50.0, 25.0, "ttft"),
    Scenario("itl-bound", 120 / 60, 128, 2048, 200.0, 13.0, "itl"),
    # Real-traffic spread (issue 17): the TTFT-bound shape with lognormal CV 1 lengths.
    Scenario("ttft-bound-lognormal", 300 / 60, 1024, 512, 50.0, 25.0, "ttft", "lognormal", 1.0),
)
PAPER_SCENARIOS = [s for s in SCENARIOS if s.name in PAPER_TABLE_V]  # Table III's two


class Arm(StrEnum):
    """The recommenders compared."""

    QUEUEING = "queueing"
    THROUGHPUT = "throughput"
    LOOK_AHEAD = "look-ahead"


# -- one run ---------------------------------------------------------------------------------


def deployment_config(
    scenario: Scenario,
    look_ahead_s: float,
    slo: SloConfig | None = None,
    initial_params: ServiceParams | None = None,
) -> DeploymentConfig:
    """The simulated deployment ours sizes: the scenario's targets unless `slo` is given."""
    return DeploymentConfig(
        name="sim",
        model_name="llama",
        source=SourceConfig(scrape_urls=("http://sim",)),
        server=SERVER,
        slo=slo or SloConfig(ttft_ms=scenario.ttft_ms, itl_ms=scenario.itl_ms),
        max_replicas=MAX_REPLICAS,
        look_ahead_s=look_ahead_s,
        initial_params=initial_params,
    )


def run_arm(
    scenario: Scenario,
    arm: Arm,
    seed: int,
    duration_s: float,
    slo: SloConfig | None = None,
    fixed: int | None = None,
) -> Run:
    """Replay the profile through the fleet with one arm deciding every window (our arms on
    `slo` when given, else on the scenario's mean targets; `fixed`: that many replicas
    throughout instead of the arm); the run keeps each window's per-token gaps and the
    requests for percentile scoring, and our arms' infeasible targets per window."""
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    profile = RateProfile.paper(scenario.base_rps)
    trace = draw_trace(
        profile,
        LengthDist(LengthKind(scenario.lengths), scenario.input_tokens, scenario.length_cv),
        LengthDist(LengthKind(scenario.lengths), scenario.output_tokens, scenario.length_cv),
        rng,
        duration_s=duration_s,
    )
    policy: OursPolicy | ThroughputPolicy | FixedPolicy
    if fixed is not None:
        policy = FixedPolicy(fixed, name=f"fixed-{fixed}")
    elif arm is Arm.THROUGHPUT:
        policy = ThroughputPolicy(KV_CAPACITY_TOKENS, MAX_REPLICAS, name=arm.value)
    else:
        look_ahead_s = LOOK_AHEAD_S if arm is Arm.LOOK_AHEAD else 0.0
        policy = OursPolicy(
            deployment_config(scenario, look_ahead_s, slo), WINDOW_S, name=arm.value
        )
    observer = PerfectObserver(kv_capacity_tokens=KV_CAPACITY_TOKENS)
    engine = Engine(FLEET, [EngineArm(policy, observer, ApplyAsIs())])
    arrivals = DrawnArrivals(trace, lambda t_s: float(profile.rate_at(t_s)))
    out = Run(scenario.name, policy.name, seed)
    for step in engine.steps(arrivals, duration_s):
        w = step.arms[0]
        obs = w.view.observation
        out.window_gaps.append(window_gaps(w.records))
        out.cycles.append(
            Cycle(
                end_s=w.end_s,
                offered_rps=step.offered_rps,
                arrival_rps=obs.arrival_rate_rps,
                provisioned=w.provisioned,
                ready=obs.ready_pods,
                desired=w.desired,
                reason=w.proposal.reason,
                tuner_state=w.proposal.tuner_state,
                capacity_rps=w.proposal.capacity_rps,
                ttft_ms=obs.ttft_ms,
                itl_ms=obs.itl_ms,
                kv_usage_ratio=w.view.kv_usage_ratio,
                peak_waiting=w.view.peak_waiting,
                loading=w.view.replica_starting,
            )
        )
        if isinstance(policy, OursPolicy):
            last = policy.cycle.recommender.last
            out.infeasible.append(() if last is None else last.infeasible_targets)
            if out.first_fit_s is None and policy.params:
                out.first_fit_s = w.end_s
    if isinstance(policy, OursPolicy):
        if policy.params is not None:
            out.params = policy.params.to_dict()
        policy.close()
    out.requests = engine.fleets()[0][1].result()
    out.wall_s = time.perf_counter() - start
    return out


# -- summaries -------------------------------------------------------------------------------


def _over(values: list[float | None], target: float, keep: list[bool]) -> int:
    return sum(1 for v, k in zip(values, keep, strict=True) if k and v is not None and v > target)


def _quantiles(values: list[float | None]) -> tuple[float, float, float]:
    seen = np.array([v for v in values if v is not None])
    if not seen.size:
        return math.nan, math.nan, math.nan
    return float(np.median(seen)), float(np.percentile(seen, 90)), float(seen.max())


def in_ramp(end_s: float) -> bool:
    """The window ends on an up-ramp or within one startup delay after it."""
    return any(lo < end_s <= hi + STARTUP_DELAY_S for lo, hi in RAMP_UP_S)


def summarize(run: Run, scenario: Scenario) -> dict[str, float]:
    """Table V figures of one run (ms, counts of cycles)."""
    c = run.cycles
    ttft = [x.ttft_ms for x in c]
    itl = [x.itl_ms for x in c]
    every = [True] * len(c)
    outside = [not x.loading for x in c]
    ramp = [in_ramp(x.end_s) for x in c]
    any_over = [
        (x.ttft_ms is not None and x.ttft_ms > scenario.ttft_ms)
        or (x.itl_ms is not None and x.itl_ms > scenario.itl_ms)
        for x in c
    ]
    t_med, t_p90, t_max = _quantiles(ttft)
    i_med, i_p90, i_max = _quantiles(itl)
    kv = [x.kv_usage_ratio for x in c]
    return {
        "cycles": len(c),
        "mean_replicas": float(np.mean([x.provisioned for x in c])),
        "peak_replicas": max(x.provisioned for x in c),
        "ttft_median_ms": t_med,
        "ttft_p90_ms": t_p90,
        "ttft_worst_ms": t_max,
        "itl_median_ms": i_med,
        "itl_p90_ms": i_p90,
        "itl_worst_ms": i_max,
        "ttft_over": _over(ttft, scenario.ttft_ms, every),
        "itl_over": _over(itl, scenario.itl_ms, every),
        "any_over": sum(any_over),
        "any_over_pct": 100.0 * sum(any_over) / len(c),
        "loading_cycles": sum(x.loading for x in c),
        "ttft_over_outside_loading": _over(ttft, scenario.ttft_ms, outside),
        "itl_over_outside_loading": _over(itl, scenario.itl_ms, outside),
        "any_over_outside_loading": sum(a and o for a, o in zip(any_over, outside, strict=True)),
        "any_over_outside_loading_pct": 100.0
        * sum(a and o for a, o in zip(any_over, outside, strict=True))
        / max(sum(outside), 1),
        "any_over_in_ramps": sum(a and r for a, r in zip(any_over, ramp, strict=True)),
        "kv_min": float(min(kv)),
        "kv_max": float(max(kv)),
        "peak_queue": max(x.peak_waiting for x in c),
        "first_fit_s": math.nan if run.first_fit_s is None else run.first_fit_s,
        "warming_cycles": sum(x.tuner_state == "warming" for x in c),
    }


# -- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help="seeds per scenario")
    names = [s.name for s in SCENARIOS] + [s.name for s in PERCENTILE_SCENARIOS]
    parser.add_argument("--scenario", choices=names, help="only this one")
    parser.add_argument(
        "--quick", action="store_true", help="one seed, first 20 minutes, no PNGs or JSON"
    )
    parser.add_argument("--arms", default=",".join(a.value for a in Arm), help="comma list")
    args = parser.parse_args(argv)
    run_start = start_run()
    logging.getLogger("exporter").setLevel(logging.ERROR)
    seeds = [FIRST_SEED + i for i in range(1 if args.quick else args.seeds)]
    duration_s = QUICK_SECONDS if args.quick else RateProfile.paper(1.0).duration_s
    arms = [Arm(a) for a in args.arms.split(",")]
    scenarios = [s for s in SCENARIOS if args.scenario in (None, s.name)]
    started = time.perf_counter()
    results: dict[str, Any] = {"seeds": seeds, "duration_s": duration_s, "scenarios": {}}
    for scenario in scenarios:
        per_arm: dict[str, list[dict[str, float]]] = {a.value: [] for a in arms}
        runs_out: list[dict[str, Any]] = []
        for seed in seeds:
            runs = [run_arm(scenario, arm, seed, duration_s) for arm in arms]
            for run in runs:
                summary = summarize(run, scenario)
                per_arm[run.arm].append(summary)
                runs_out.append(
                    {
                        "arm": run.arm,
                        "seed": seed,
                        "wall_s": run.wall_s,
                        "final_params": run.params,
                        "summary": summary,
                        "cycles": table_columns(run.cycles),
                    }
                )
                print(
                    f"  {scenario.name} seed {seed} {run.arm:>10}: {run.wall_s:5.1f} s, "
                    f"over any {summary['any_over']}/{summary['cycles']} "
                    f"(outside loading {summary['any_over_outside_loading']}), "
                    f"mean replicas {summary['mean_replicas']:.2f}, params {run.params}",
                    flush=True,
                )
            if not args.quick:
                plot_runs(scenario, runs, RESULTS_DIR / f"closed_loop_{scenario.name}_{seed}.png")
        table = {
            arm: {key: spread([s[key] for s in summaries]) for key in summaries[0]}
            for arm, summaries in per_arm.items()
        }
        print_table(scenario, table, len(seeds))
        results["scenarios"][scenario.name] = {
            "scenario": asdict(scenario),
            "paper": PAPER_TABLE_V.get(scenario.name),
            "table": table,
            "runs": runs_out,
        }
    if all(s.name in results["scenarios"] for s in PAPER_SCENARIOS):
        paper_runs = {s.name: results["scenarios"][s.name] for s in PAPER_SCENARIOS}
        results["both_scenarios"] = print_combined(paper_runs, [a.value for a in arms], seeds)
    run_percentile_scenarios(
        args.scenario,
        seeds,
        None if args.quick else RESULTS_DIR / "closed_loop_percentiles.json",
        run_start,
        lambda base, thr, slo, seed, fixed=None: run_arm(
            next(s for s in SCENARIOS if s.name == base),
            Arm.THROUGHPUT if thr else Arm.QUEUEING,
            seed,
            duration_s,
            slo,
            fixed,
        ),
        MAX_REPLICAS,
    )
    wall = time.perf_counter() - started
    results["wall_s"] = wall
    print(f"\nwall time {wall:.0f} s")
    if not args.quick and scenarios:
        RESULTS_DIR.mkdir(exist_ok=True)
        path = RESULTS_DIR / "closed_loop.json"
        path.write_text(json.dumps(json_safe(with_run(run_start, results)), separators=(",", ":")))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
