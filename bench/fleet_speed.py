"""How long one fleet decision takes: 3 models x 4 variants (goal 20 ms) and 200 models x 4
variants sharing 4 GPU types (goal 1 s), with GPUs to spare and with too few.

Each figure is one `FleetPlanner.decide` (the MILP, the stability re-solve when the mix would
change, make-before-break and stabilization): `cold` with nothing running, `steady` with the
last plan running and the demand moved by up to 5 %. Wall and process CPU time are both
reported: on a shared machine the wall clock carries other processes' load, CPU time does not
(HiGHS runs in this process).

    python bench/fleet_speed.py  ->  bench/results/fleet_speed.json
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.lib.envelope import start_run, with_run  # noqa: E402
from exporter.sizing.fleet.plan import FleetPlanner  # noqa: E402
from exporter.sizing.fleet.values import FleetInput, FleetModel, Routing, Variant  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
GOALS_S = {"small": 0.020, "large": 1.0}
# GPU type: (price per GPU-hour, speed relative to the h100).
TYPES = {"h100": (4.0, 1.0), "a100": (2.5, 0.55), "l40s": (1.4, 0.35), "l4": (0.8, 0.15)}


def fleet(rng: random.Random, n_models: int, *, short: bool) -> FleetInput:
    """n_models models, each with one variant per GPU type; inventory on every type enough
    for all the demand on the least capable type (`short`: a fifteenth of that, about a
    third of what the plan wants)."""
    models, variants = [], []
    need = 0.0
    for j in range(n_models):
        size = rng.uniform(0.5, 3.0)  # per-replica capacity scale of the model
        demand = rng.uniform(0.0, 40.0)
        routing = Routing.EVEN if j % 3 == 0 else Routing.WEIGHTED
        models.append(FleetModel(name=f"m{j}", demand_rps=demand, priority=j % 3, routing=routing))
        for kind, (price, speed) in TYPES.items():
            gpus = 1 if speed > 0.5 else 2
            variants.append(
                Variant(
                    name=f"m{j}-{kind}",
                    model=f"m{j}",
                    accelerator=kind,
                    gpus_per_replica=gpus,
                    price_per_gpu_hour=price * rng.uniform(0.9, 1.1),
                    capacity_rps=10.0 * speed * gpus / size * rng.uniform(0.8, 1.2),
                    max_replicas=40,
                    trusted=rng.random() > 0.1,
                    prior_capacity_rps=10.0 * speed * gpus / size,
                )
            )
        need += demand * size / 10.0
    per_type = int(6 * need) + 4
    if short:
        per_type = per_type // 15
    return FleetInput(
        models=tuple(models), variants=tuple(variants), inventory=dict.fromkeys(TYPES, per_type)
    )


def timed(planner: FleetPlanner, now_s: float, inp: FleetInput) -> tuple[float, float, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    plan = planner.decide(now_s, inp)
    return time.perf_counter() - wall, time.process_time() - cpu, plan


def scenario(n_models: int, short: bool, cycles: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    walls: dict[str, list[float]] = {"cold": [], "steady": []}
    cpus: dict[str, list[float]] = {"cold": [], "steady": []}
    unserved, optimal = [], 0
    for _ in range(cycles):
        inp = fleet(rng, n_models, short=short)
        planner = FleetPlanner()
        wall, cpu, plan = timed(planner, 0.0, inp)
        walls["cold"].append(wall)
        cpus["cold"].append(cpu)
        running = tuple(
            replace(v, current_replicas=plan.desired[v.name], ready_replicas=plan.desired[v.name])
            for v in inp.variants
        )
        moved = tuple(
            replace(m, demand_rps=m.demand_rps * rng.uniform(0.95, 1.05)) for m in inp.models
        )
        wall, cpu, plan = timed(planner, 30.0, replace(inp, models=moved, variants=running))
        walls["steady"].append(wall)
        cpus["steady"].append(cpu)
        unserved.append(sum(plan.unserved_rps.values()))
        optimal += plan.optimal
    out: dict[str, Any] = {"models": n_models, "variants": 4 * n_models, "short": short}
    out["cycles"] = cycles
    for kind in walls:
        out[kind] = {
            "wall_median_s": statistics.median(walls[kind]),
            "wall_max_s": max(walls[kind]),
            "cpu_median_s": statistics.median(cpus[kind]),
            "cpu_max_s": max(cpus[kind]),
        }
    out["unserved_rps_median"] = statistics.median(unserved)
    out["steady_plans_proven_optimal"] = optimal
    return out


def main() -> None:
    run_start = start_run()
    load_start = os.getloadavg()
    runs = [
        ("small", 3, False, 40),
        ("small", 3, True, 40),
        ("large", 200, False, 5),
        ("large", 200, True, 5),
    ]
    results = []
    print(f"{'case':6} {'models':>6} {'short':>5} {'cycle':6} {'wall med ms':>11} "
          f"{'wall max ms':>11} {'cpu med ms':>10} {'goal ms':>8}")  # fmt: skip
    for case, n, short, cycles in runs:
        row = scenario(n, short, cycles, seed=n + short)
        row["case"], row["goal_s"] = case, GOALS_S[case]
        results.append(row)
        for kind in ("cold", "steady"):
            r = row[kind]
            print(
                f"{case:6} {n:6d} {short!s:>5} {kind:6} {1e3 * r['wall_median_s']:11.1f} "
                f"{1e3 * r['wall_max_s']:11.1f} {1e3 * r['cpu_median_s']:10.1f} "
                f"{1e3 * GOALS_S[case]:8.0f}"
            )
    load_end = os.getloadavg()
    print(f"load average (1, 5, 15 min): start {load_start}, end {load_end}")
    envelope = {
        "results": results,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fleet_speed.json").write_text(
        json.dumps(with_run(run_start, envelope), indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
