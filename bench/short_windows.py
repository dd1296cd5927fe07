"""A seeded tuner on short windows of steady single-shape traffic: the soak's healthy
deployments, simulated, so that what their calibration does can be measured and compared.

One simulated replica serves 512 / 128-token requests (uniform on [x/2, 3x/2], Poisson) at a
constant 10.8 req/s for 20 minutes; the daemon (no look-ahead) sees 5 s windows, observed as
the closed loop observes them with one gauge sample per window, and starts from the true
parameters (Table I Llama made three times slower, as in `bench/soak.py`; TTFT 180 ms, ITL 60
ms). Its published SLO capacity per cycle is compared with the simulator's, measured as in
`bench/tuner_robustness.py` (constant-load runs; first-token convention: the simulator's, the
first token with the last prefill chunk, while the tuner's parameters charge it one decode
iteration more). Three seeds, each twice: as read, and with every window's arrival rate and mean
lengths replaced by the true ones (what the tuner would see without their sampling noise).

Run: .venv/bin/python bench/short_windows.py   (from the repository root; about 20 s)
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.closed_loop import deployment_config  # noqa: E402
from bench.lib.closed_loop_report import Scenario  # noqa: E402
from bench.lib.envelope import start_run, with_run  # noqa: E402
from bench.lib.single_shape import simulate_windows  # noqa: E402
from bench.tuner_robustness import SERVER, measure_truth  # noqa: E402
from exporter.replay.perfect import WindowView  # noqa: E402
from exporter.replay.policies import OursPolicy  # noqa: E402
from model import ServiceParams, Workload, max_rate_for_slo  # noqa: E402
from model.simulation.workloads import RateProfile  # noqa: E402

OUT = REPO_ROOT / "bench" / "results" / "short_windows.json"
SLOWER = 3.0
TRUE = ServiceParams(6.68 * SLOWER, 2.01e-2 * SLOWER, 5.52e-5 * SLOWER)
SCENARIO = Scenario("soak-like", 10.8, 512, 128, 60.0 * SLOWER, 20.0 * SLOWER, "itl")
WINDOW_S = 5.0
DURATION_S = 1200.0
SEEDS = (7, 8, 9)


def exact(view: WindowView) -> WindowView:
    """The window with its arrival rate and mean lengths at their true values."""
    obs = replace(
        view.observation,
        arrival_rate_rps=SCENARIO.base_rps,
        avg_input_tokens=float(SCENARIO.input_tokens),
        avg_output_tokens=float(SCENARIO.output_tokens),
    )
    return replace(view, observation=obs)


def run(seed: int, exact_regressors: bool) -> dict[str, Any]:
    """One seeded run: the published capacity per cycle and the final parameters."""
    shape = (float(SCENARIO.input_tokens), float(SCENARIO.output_tokens))
    profile = RateProfile.constant(SCENARIO.base_rps, DURATION_S)
    views = simulate_windows(
        TRUE, SERVER, shape, profile, DURATION_S, seed, window_s=WINDOW_S, sample_s=WINDOW_S
    )
    if exact_regressors:
        views = [exact(v) for v in views]
    arm = OursPolicy(deployment_config(SCENARIO, 0.0, initial_params=TRUE), WINDOW_S)
    capacity = [arm.decide(v, v.observation.end_time_s, 1).capacity_rps for v in views]
    final = None if arm.params is None else arm.params.to_dict()
    return {"capacity_rps": capacity, "final_params_ms": final}


def main() -> None:
    run_start = start_run()
    start = time.perf_counter()
    truth = measure_truth(TRUE, SCENARIO, 5)
    model = max_rate_for_slo(
        TRUE, SERVER, Workload(512, 128), SCENARIO.ttft_ms, SCENARIO.itl_ms
    ).rate_rps
    print(f"simulator's capacity {truth.capacity_rps:.2f} req/s per replica; the model's at the "
          f"true parameters {model:.2f}")  # fmt: skip
    runs = {}
    for seed, exact_regressors in ((s, e) for e in (False, True) for s in SEEDS):
        found = run(seed, exact_regressors)
        ratio = np.array([c for c in found["capacity_rps"] if c is not None]) / truth.capacity_rps
        found["capacity_ratio"] = {
            "min": float(ratio.min()), "median": float(np.median(ratio)),
            "max": float(ratio.max()), "within_25pct": float(np.mean(np.abs(ratio - 1) <= 0.25)),
        }  # fmt: skip
        name = f"{'true rate and lengths' if exact_regressors else 'as read'}, seed {seed}"
        runs[name] = found
        r, p = found["capacity_ratio"], found["final_params_ms"]
        print(f"{name}: published / simulator's capacity min {r['min']:.2f} median "
              f"{r['median']:.2f} max {r['max']:.2f}, within 25 % in {100 * r['within_25pct']:.0f} "
              f"% of cycles; final parameters {p}")  # fmt: skip
    wall = time.perf_counter() - start
    OUT.write_text(
        json.dumps(
            with_run(run_start, {"truth_capacity_rps": truth.capacity_rps,
                                 "model_capacity_rps": model, "runs": runs, "wall_s": wall}),
            indent=1,
        )
    )
    print(f"wall {wall:.0f} s; wrote {OUT.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    main()
