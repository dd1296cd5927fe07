"""Predicted latency percentiles against the request-level simulator.

Grid: mean input x output lengths {64, 256, 1024, 4096}^2 at 0.2, 0.4, 0.6, 0.8 of the model's
saturation rate (64 points), Table I Llama-3.1-8B parameters, B = 256, M = 8192, lengths uniform
on [x/2, 3x/2]; once with Poisson arrivals and once with constant-rate arrivals (128 runs),
8000 measured requests per run, fixed seeds (bench/lib/percentile_sim.py measures). First-token
convention: the simulator emits the first token with the last prefill chunk, so the model is
evaluated with first_token=WITH_LAST_CHUNK, at the measured requests' mean lengths, with the
arrival CV of the run and the uniform law's length CV (0.289).

Thresholds: median |relative error| <= 5 % for TTFT p50/p90/p95/p99 and per-token ITL p90/p99
(Poisson), <= 10 % for per-request ITL p99, no point worse than 30 % on any of them; with
constant-rate arrivals the same for TTFT and per-request ITL (per-token ITL printed only).

Writes bench/results/percentiles.json and bench/results/percentiles.png.
Run: .venv/bin/python bench/percentiles.py [--requests N] [--jobs 2] [--reuse-sim]
(--reuse-sim takes the simulated figures from the existing JSON and re-evaluates the model.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.lib.envelope import start_run, with_run  # noqa: E402
from bench.lib.percentile_sim import QUANTILES, simulate_point  # noqa: E402
from model import (  # noqa: E402
    FirstToken,
    ModelOptions,
    ServerConfig,
    ServiceParams,
    Workload,
    analyze,
    latency_quantiles,
)
from model.queueing.variant import UNIFORM_HALF_WIDTH_CV  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent / "results"
LLAMA = ServiceParams(alpha_ms=6.68, beta_ms=2.01e-2, gamma_ms=5.52e-5)
SERVER = ServerConfig(max_batch_size=256, max_num_batched_tokens=8192)
LENGTHS = (64, 256, 1024, 4096)
LOADS = (0.2, 0.4, 0.6, 0.8)
ARRIVALS = {"poisson": 1.0, "constant": 0.0}
SEED = 20261202
METRICS = ("ttft", "itl_per_token", "itl_per_request")
# (metric, quantile index, median limit, required for constant-rate arrivals)
CHECKS = (
    ("ttft", 0, 0.05, True),
    ("ttft", 1, 0.05, True),
    ("ttft", 2, 0.05, True),
    ("ttft", 3, 0.05, True),
    ("itl_per_token", 1, 0.05, False),
    ("itl_per_token", 3, 0.05, False),
    ("itl_per_request", 3, 0.10, True),
)
WORST_LIMIT = 0.30


def options(arrival_cv: float) -> ModelOptions:
    return ModelOptions(
        arrival_cv=arrival_cv,
        input_length_cv=UNIFORM_HALF_WIDTH_CV,
        output_length_cv=UNIFORM_HALF_WIDTH_CV,
    )


def run_point(task: tuple[str, int, int, float, int, int]) -> dict[str, Any]:
    arrivals, n, m, load, requests, seed = task
    cv = ARRIVALS[arrivals]
    light = analyze(LLAMA, SERVER, Workload(n, m), 0.0, options=options(cv))
    sat = float(light.saturation_rate_rps)
    sim = simulate_point(LLAMA, SERVER, n, m, load * sat, cv, requests, seed, options(cv))
    return {"arrivals": arrivals, "input_tokens": n, "output_tokens": m, "load": load,
            "rate_rps": load * sat, "seed": seed, "sim": asdict(sim)}


def predict(point: dict[str, Any]) -> dict[str, list[float]]:
    sim = point["sim"]
    shape = Workload(sim["mean_input_tokens"], sim["mean_output_tokens"])
    q = latency_quantiles(LLAMA, SERVER, shape, point["rate_rps"], QUANTILES,
                          options=options(ARRIVALS[point["arrivals"]]),
                          first_token=FirstToken.WITH_LAST_CHUNK)
    return {"ttft": q.ttft_ms.tolist(), "itl_per_token": q.itl_per_token_ms.tolist(),
            "itl_per_request": q.itl_per_request_ms.tolist()}


def errors(point: dict[str, Any]) -> dict[str, list[float]]:
    return {
        metric: [(p - s) / s for p, s in zip(point["model"][metric],
                                             point["sim"][f"{metric}_ms"], strict=True)]
        for metric in METRICS
    }


def summary(points: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for arrivals in ARRIVALS:
        sel = [p for p in points if p["arrivals"] == arrivals]
        table: dict[str, Any] = {}
        for metric in METRICS:
            err = np.abs(np.array([p["errors"][metric] for p in sel]))
            table[metric] = {"median_abs": np.median(err, axis=0).tolist(),
                             "worst_abs": err.max(axis=0).tolist()}
        checks = []
        for metric, k, limit, for_constant in CHECKS:
            if arrivals == "constant" and not for_constant:
                continue
            err = np.abs(np.array([p["errors"][metric][k] for p in sel]))
            worst = int(np.argmax(err))
            checks.append({
                "metric": metric, "quantile": QUANTILES[k], "median_abs": float(np.median(err)),
                "median_limit": limit, "worst_abs": float(err[worst]),
                "worst_limit": WORST_LIMIT,
                "worst_point": f"{sel[worst]['input_tokens']}/{sel[worst]['output_tokens']} "
                               f"at {sel[worst]['load']}",
                "met": bool(np.median(err) <= limit and err[worst] <= WORST_LIMIT),
            })
        out[arrivals] = {"errors": table, "checks": checks}
    return out


def print_tables(points: list[dict[str, Any]], result: dict[str, Any]) -> None:
    qs = "/".join(f"p{round(q * 100):d}" for q in QUANTILES)
    for arrivals in ARRIVALS:
        print(f"\n{arrivals} arrivals: signed relative error of the model ({qs}), "
              "first_token=with_last_chunk")
        print(f"{'n':>5} {'m':>5} {'load':>4} | {'TTFT':^31} | {'ITL per token':^31} | "
              f"{'ITL per request':^31}")
        for p in (p for p in points if p["arrivals"] == arrivals):
            cells = " | ".join(" ".join(f"{e:+7.1%}" for e in p["errors"][m]) for m in METRICS)
            print(f"{p['input_tokens']:>5} {p['output_tokens']:>5} {p['load']:>4} | {cells}")
        tab = result[arrivals]["errors"]
        for label, key in (("median |err|", "median_abs"), ("worst |err|", "worst_abs")):
            cells = " | ".join(" ".join(f"{e:7.1%}" for e in tab[m][key]) for m in METRICS)
            print(f"{label:>16} | {cells}")
        for c in result[arrivals]["checks"]:
            verdict = "met" if c["met"] else "MISSED"
            print(f"  {c['metric']} p{round(c['quantile'] * 100):d}: median {c['median_abs']:.1%}"
                  f" (<= {c['median_limit']:.0%}), worst {c['worst_abs']:.1%} at "
                  f"{c['worst_point']} (<= {c['worst_limit']:.0%}): {verdict}")


def plot(points: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 5.2))
    titles = ("TTFT (ms)", "ITL per token (ms)", "ITL per request (ms)")
    markers = {"poisson": "o", "constant": "x"}
    for ax, metric, title in zip(axes, METRICS, titles, strict=True):
        for arrivals, marker in markers.items():
            for k, q in enumerate(QUANTILES):
                sel = [p for p in points if p["arrivals"] == arrivals]
                ax.scatter([p["sim"][f"{metric}_ms"][k] for p in sel],
                           [p["model"][metric][k] for p in sel], s=12, marker=marker,
                           color=f"C{k}", label=f"p{round(q * 100)} {arrivals}")
        values = [v for p in points for v in p["model"][metric] + p["sim"][f"{metric}_ms"]]
        lo, hi = min(values) / 1.3, max(values) * 1.3
        ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), title=title,
               xlabel="simulated", ylabel="predicted")
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle("Predicted vs simulated latency percentiles (Llama-3.1-8B, B=256, M=8192, "
                 "64 points x Poisson / constant-rate arrivals)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8000, help="measured requests per run")
    parser.add_argument("--jobs", type=int, default=1, help="simulator processes (at most 2)")
    parser.add_argument("--reuse-sim", action="store_true",
                        help="take simulated figures from the existing percentiles.json")
    args = parser.parse_args()
    run_start = start_run()
    out_path = RESULTS_DIR / "percentiles.json"
    began = time.perf_counter()
    sim_wall_s = None
    if args.reuse_sim:
        previous = json.loads(out_path.read_text())
        points, sim_wall_s = previous["points"], previous["sim_wall_s"]
    else:
        tasks = [
            (arrivals, n, m, load, args.requests,
             SEED + 1000 * a + 100 * (4 * i + j) + k)
            for a, arrivals in enumerate(ARRIVALS)
            for i, n in enumerate(LENGTHS)
            for j, m in enumerate(LENGTHS)
            for k, load in enumerate(LOADS)
        ]
        with ProcessPoolExecutor(max_workers=max(1, min(args.jobs, 2))) as pool:
            points = list(pool.map(run_point, tasks))
    if sim_wall_s is None:
        sim_wall_s = time.perf_counter() - began
    model_began = time.perf_counter()
    for p in points:
        p["model"] = predict(p)
        p["errors"] = errors(p)
    model_wall_s = time.perf_counter() - model_began
    result = summary(points)
    print_tables(points, result)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    plot(points, RESULTS_DIR / "percentiles.png")
    out = {
        "params": LLAMA.to_dict(),
        "server": SERVER.to_dict(),
        "first_token": FirstToken.WITH_LAST_CHUNK.value,
        "quantiles": list(QUANTILES),
        "loads": list(LOADS),
        "requests_per_point": min(p["sim"]["measured"] for p in points),
        "seed": SEED,
        "summary": result,
        "points": points,
        "sim_wall_s": sim_wall_s,
        "model_wall_s": model_wall_s,
    }
    out_path.write_text(json.dumps(with_run(run_start, out), indent=1, allow_nan=False) + "\n")
    met = all(c["met"] for r in result.values() for c in r["checks"])
    print(f"\nall thresholds met: {met}; simulation {sim_wall_s:.0f} s, model {model_wall_s:.2f} s"
          f" for {len(points)} points; wrote {out_path} and percentiles.png")


if __name__ == "__main__":
    main()
