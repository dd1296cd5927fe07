"""Speed of the tuner: prints a table and writes bench/results/tuner_speed.json.

1. Offline fit of the paper's 112 H100 points per model (in_paper_fit = 1, B = 256, M = 8192),
   trust region (the default) against Nelder-Mead with the reference settings: median wall
   time, model evaluations, fitted parameters and errors beside paper Table I.
2. One sliding-window refit of 10 points, warm-started from the previous estimate:
   (a) `Tuner.update` in steady state on a synthetic stream (Llama Table I parameters, 5 %
   noise, four request shapes, loads 15-85 %), outlier pass included, then `Tuner.bias`, which
   refits the ITL curve (model/calibration/itl_curve.py) sizing reads; (b) `fit` on 10 random
   points of the real grid, warm-started from the 112-point fit.

Goals on a 2-core machine: refit <= 20 ms, 112-point fit <= 1 s.
Run: .venv/bin/python bench/tuner_speed.py
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.lib.envelope import start_run, with_run  # noqa: E402
from exporter.cli.fit import read_observations  # noqa: E402
from model import (  # noqa: E402
    PAPER_MODEL,
    FitMethod,
    FitResult,
    Observation,
    ServerConfig,
    ServiceParams,
    Tuner,
    fit,
)
from model.queueing.analyzer import analyze_points  # noqa: E402


class PaperRow(NamedTuple):
    """One row of paper Table I: alpha, beta, gamma (ms), ITL and TTFT error (fractions)."""

    params: tuple[float, float, float]
    itl_error: float
    ttft_error: float


GRID_CSV = REPO_ROOT / "tests" / "data" / "h100-grid.csv"
RESULTS = REPO_ROOT / "bench" / "results"
SERVER = ServerConfig(max_batch_size=256, max_num_batched_tokens=8192)
# Paper Table I (the grid README): alpha, beta, gamma (ms), ITL and TTFT error (fractions).
TABLE_ONE: dict[str, PaperRow] = {
    "Llama-3.1-8B": PaperRow((6.68, 2.01e-2, 5.52e-5), itl_error=0.046, ttft_error=0.136),
    "Qwen2.5-14B": PaperRow((10.14, 3.68e-2, 8.48e-5), itl_error=0.079, ttft_error=0.158),
}
GOAL_REFIT_S = 0.020
GOAL_OFFLINE_S = 1.0


def grid(model_name: str) -> list[Observation]:
    return read_observations(
        GRID_CSV, keep=lambda r: r["model"] == model_name and r["in_paper_fit"] == "1"
    )


def synthetic_stream(
    params: ServiceParams, count: int, rng: np.random.Generator
) -> list[Observation]:
    """Four request shapes in turn at loads in [0.15, 0.85] of saturation, 5 % noise."""
    shapes = [(256.0, 256.0), (1024.0, 1024.0), (4096.0, 256.0), (256.0, 2048.0)]
    n = np.array([shapes[k % 4][0] for k in range(count)])
    m = np.array([shapes[k % 4][1] for k in range(count)])
    light = analyze_points(params, SERVER, n, m, np.full(count, 1e-3))
    rate = rng.uniform(0.15, 0.85, count) * np.asarray(light.saturation_rate_rps)
    out = analyze_points(params, SERVER, n, m, rate)
    ttft = np.asarray(out.ttft_ms) * np.exp(rng.normal(0.0, 0.05, count))
    itl = np.asarray(out.itl_ms) * np.exp(rng.normal(0.0, 0.05, count))
    return [
        Observation(
            rate_rps=float(rate[k]),
            avg_input_tokens=float(n[k]),
            avg_output_tokens=float(m[k]),
            ttft_ms=float(ttft[k]),
            itl_ms=float(itl[k]),
        )
        for k in range(count)
    ]


def timed_fits(
    obs: list[Observation], repeats: int, **kwargs: Any
) -> tuple[float, FitResult, list[int]]:
    """Median wall time (s) over repeats, the last result, and every repeat's nfev."""
    times, nfevs = [], []
    result = None
    for _ in range(repeats):
        start = time.perf_counter()
        # Table I is the paper variant's fit.
        result = fit(obs, SERVER, options=PAPER_MODEL, **kwargs)
        times.append(time.perf_counter() - start)
        nfevs.append(result.nfev)
    assert result is not None
    return statistics.median(times), result, nfevs


def summary(result: FitResult, seconds: float, nfevs: list[int]) -> dict[str, Any]:
    return {
        "median_s": seconds,
        "median_nfev": statistics.median(nfevs),
        "status": result.status.value,
        "params": result.params.to_dict(),
        "ttft_error": result.ttft_error.mean_ratio,
        "itl_error": result.itl_error.mean_ratio,
        "ttft_median_error": result.ttft_error.median_ratio,
        "itl_median_error": result.itl_error.median_ratio,
        "identified": list(result.identified),
        "std_errors": list(result.std_errors),
        "condition_number": result.condition_number,
    }


def offline() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, paper in TABLE_ONE.items():
        obs = grid(name)
        fit(obs, SERVER, options=PAPER_MODEL)  # warm caches and imports
        tr_s, tr, tr_n = timed_fits(obs, 7)
        nm_s, nm, nm_n = timed_fits(obs, 3, method=FitMethod.NELDER_MEAD)
        ours = np.array(tr.params.as_tuple())
        out[name] = {
            "points": len(obs),
            "trust_region": summary(tr, tr_s, tr_n),
            "nelder_mead": summary(nm, nm_s, nm_n),
            "paper": {
                "params": dict(zip(("alpha_ms", "beta_ms", "gamma_ms"), paper.params, strict=True)),
                "itl_error": paper.itl_error,
                "ttft_error": paper.ttft_error,
            },
            "param_rel_diff_vs_paper": (ours / np.array(paper.params) - 1.0).tolist(),
            "itl_error_diff_pp": 100 * (tr.itl_error.mean_ratio - paper.itl_error),
            "ttft_error_diff_pp": 100 * (tr.ttft_error.mean_ratio - paper.ttft_error),
        }
    return out


def tuner_refits(cycles: int = 60) -> dict[str, Any]:
    """Steady-state `Tuner.update` on a synthetic stream: one 10-point refit per cycle."""
    truth = ServiceParams(*TABLE_ONE["Llama-3.1-8B"].params)
    rng = np.random.default_rng(7)
    stream = synthetic_stream(truth, cycles + 10, rng)
    tuner = Tuner(SERVER)
    for obs in stream[:10]:
        tuner.update(obs)
    curves = 0
    times, bias_times, nfevs, outliers, accepted = [], [], [], 0, 0
    for obs in stream[10:]:
        start = time.perf_counter()
        status = tuner.update(obs)
        times.append(time.perf_counter() - start)
        # Sizing then asks for the bias, which refits the ITL curve over its points.
        start = time.perf_counter()
        bias = tuner.bias()
        bias_times.append(time.perf_counter() - start)
        curves += bias is not None and bias.itl_curve is not None
        if status.fit is not None:
            nfevs.append(status.fit.nfev)
        outliers += bool(status.dropped_outliers)
        accepted += status.success
    return {
        "cycles": cycles,
        "median_s": statistics.median(times),
        "p90_s": float(np.quantile(times, 0.9)),
        "median_nfev": statistics.median(nfevs),
        "bias_median_s": statistics.median(bias_times),
        "cycles_with_itl_curve": curves,
        "accepted_fits": accepted,
        "outlier_refits": outliers,
        "final_params": None if tuner.params is None else tuner.params.to_dict(),
    }


def grid_window_refits(windows: int = 30) -> dict[str, Any]:
    """`fit` on 10 random real grid points, warm-started from the 112-point fit."""
    obs = grid("Llama-3.1-8B")
    start = fit(obs, SERVER, options=PAPER_MODEL).params
    rng = np.random.default_rng(11)
    out: dict[str, Any] = {}
    for method in FitMethod:
        times, nfevs = [], []
        for _ in range(windows):
            window = [obs[k] for k in rng.choice(len(obs), 10, replace=False)]
            t0 = time.perf_counter()
            result = fit(window, SERVER, start, method=method, options=PAPER_MODEL)
            times.append(time.perf_counter() - t0)
            nfevs.append(result.nfev)
        out[method.value] = {
            "windows": windows,
            "median_s": statistics.median(times),
            "median_nfev": statistics.median(nfevs),
        }
    return out


def main() -> None:
    run_start = start_run()
    results: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count()},
        "goals": {"refit_s": GOAL_REFIT_S, "offline_112_s": GOAL_OFFLINE_S},
        "offline": offline(),
        "refit_tuner_update": tuner_refits(),
        "refit_grid_window": grid_window_refits(),
    }
    print("Offline fit, 112 H100 points (trust region vs Nelder-Mead; paper Table I)")
    print(
        f"{'model':14} {'method':13} {'ms':>7} {'nfev':>5} {'alpha':>8} {'beta':>9} "
        f"{'gamma':>9} {'ITL %':>6} {'TTFT %':>6}"
    )
    for name, row in results["offline"].items():
        for method in ("trust_region", "nelder_mead"):
            r = row[method]
            p = r["params"]
            print(
                f"{name:14} {method:13} {1e3 * r['median_s']:7.1f} {r['median_nfev']:5.0f} "
                f"{p['alpha_ms']:8.3f} {p['beta_ms']:9.3e} {p['gamma_ms']:9.3e} "
                f"{100 * r['itl_error']:6.2f} {100 * r['ttft_error']:6.2f}"
            )
        paper = row["paper"]
        pp = paper["params"]
        print(
            f"{name:14} {'paper':13} {'':>7} {'':>5} {pp['alpha_ms']:8.3f} "
            f"{pp['beta_ms']:9.3e} {pp['gamma_ms']:9.3e} {100 * paper['itl_error']:6.2f} "
            f"{100 * paper['ttft_error']:6.2f}"
        )
    tu = results["refit_tuner_update"]
    print(
        f"\nSliding-window refit, 10 points: Tuner.update median {1e3 * tu['median_s']:.2f} ms "
        f"(p90 {1e3 * tu['p90_s']:.2f} ms), median nfev {tu['median_nfev']:.0f}, "
        f"{tu['accepted_fits']}/{tu['cycles']} accepted, {tu['outlier_refits']} outlier refits"
    )
    print(
        f"  then Tuner.bias (the ITL curve refitted over its points): median "
        f"{1e3 * tu['bias_median_s']:.2f} ms, a curve in "
        f"{tu['cycles_with_itl_curve']}/{tu['cycles']}"
    )
    for method, r in results["refit_grid_window"].items():
        print(
            f"  real-grid 10-point window, {method:13}: median {1e3 * r['median_s']:.2f} ms, "
            f"nfev {r['median_nfev']:.0f}"
        )
    worst_offline = max(r["trust_region"]["median_s"] for r in results["offline"].values())
    print(
        f"\nGoals: refit {1e3 * tu['median_s']:.1f} ms <= {1e3 * GOAL_REFIT_S:.0f} ms: "
        f"{tu['median_s'] <= GOAL_REFIT_S}; 112-point fit {worst_offline:.3f} s <= "
        f"{GOAL_OFFLINE_S:.0f} s: {worst_offline <= GOAL_OFFLINE_S}"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = with_run(run_start, results)
    (RESULTS / "tuner_speed.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
