"""The joint program with integer counts against the same program where the models a stage
holds all served choose among whole candidate plans (`milp.CANDIDATES`), on the fleets of
bench/fleet_speed.py with too few GPUs: the plan each finds, whether it is proven, how long
it takes, and the best bound HiGHS proved for the stage that maximizes what the lowest
priority level gets (the stage that does not finish). Also the 3 x 4 instances' solve time.

    python bench/fleet_formulations.py  ->  bench/results/fleet_formulations.json
"""

from __future__ import annotations

import itertools
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

from bench.fleet_speed import fleet  # noqa: E402
from bench.lib.envelope import start_run, with_run  # noqa: E402
from exporter.sizing.fleet import milp  # noqa: E402
from exporter.sizing.fleet.evaluate import rank  # noqa: E402
from exporter.sizing.fleet.values import FleetInput  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FORMULATIONS = {"counts": False, "candidates": True}
# The default solver budget of a plan, and a longer one to see how far each formulation gets.
BUDGETS_S = (1.0, 8.0)


class Bounds:
    """Records what HiGHS reports for every solve (the solver's own result fields)."""

    def __init__(self) -> None:
        self.solves: list[dict[str, Any]] = []
        self._milp = milp.milp

    def __call__(self, c: Any, **kwargs: Any) -> Any:
        result = self._milp(c, **kwargs)
        self.solves.append(
            {
                "columns": len(c),
                "status": int(result.status),
                "objective": getattr(result, "fun", None),
                "dual_bound": getattr(result, "mip_dual_bound", None),
                "nodes": getattr(result, "mip_node_count", None),
            }
        )
        return result


def one(inp: FleetInput, candidates: bool) -> dict[str, Any]:
    milp.CANDIDATES = candidates
    probe = Bounds()
    milp.milp = probe  # type: ignore[assignment]  # measured, then restored
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        plan = milp.solve(inp)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        milp.milp = probe._milp
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "optimal": plan.optimal,
        "rank": list(rank(inp, plan)),  # unserved req/s per level, highest first; cost/h
        "solves": probe.solves,
    }


def main() -> None:
    run_start = start_run()
    load_start = os.getloadavg()
    large: list[dict[str, Any]] = []
    rng = random.Random(201)  # the seed bench/fleet_speed.py uses for this case
    print(f"{'instance':9} {'budget':>6} {'formulation':11} {'wall s':>7} {'cpu s':>6} "
          f"{'proven':>6} {'lowest level unserved':>21} {'its bound':>9} {'cost/h':>8}")
    for k, budget in itertools.product(range(2), BUDGETS_S):
        if budget == BUDGETS_S[0]:
            base = fleet(rng, 200, short=True)
        inp = replace(base, solve_time_limit_s=budget)
        for name, flag in FORMULATIONS.items():
            row = {"instance": k, "budget_s": budget, "formulation": name, **one(inp, flag)}
            large.append(row)
            # The first stage that ran out of time (the lowest level's), else none.
            bounds = [s["dual_bound"] for s in row["solves"] if s["status"] == 1]
            bound = bounds[0] if bounds and bounds[0] is not None else float("nan")
            print(
                f"200x4 #{k:<2} {budget:6.1f} {name:11} {row['wall_s']:7.2f} {row['cpu_s']:6.2f} "
                f"{row['optimal']!s:>6} {row['rank'][-2]:21.1f} {bound:9.1f} "
                f"{row['rank'][-1]:8.1f}"
            )
    small: dict[str, dict[str, float]] = {}
    for name, flag in FORMULATIONS.items():
        rng = random.Random(4)  # the seed bench/fleet_speed.py uses for 3 x 4 short
        cpus, proven = [], 0
        for _ in range(40):
            row = one(fleet(rng, 3, short=True), flag)
            cpus.append(row["cpu_s"])
            proven += row["optimal"]
        small[name] = {"cpu_median_s": statistics.median(cpus), "cpu_max_s": max(cpus),
                       "proven": proven}  # fmt: skip
        print(f"3x4 short {name:11} cpu median {1e3 * statistics.median(cpus):.1f} ms, "
              f"max {1e3 * max(cpus):.1f} ms, proven {proven}/40")  # fmt: skip
    milp.CANDIDATES = False
    print(f"load average (1, 5, 15 min): start {load_start}, end {os.getloadavg()}")
    RESULTS.mkdir(exist_ok=True)
    out = with_run(run_start, {"large_short": large, "small_short": small})
    (RESULTS / "fleet_formulations.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
