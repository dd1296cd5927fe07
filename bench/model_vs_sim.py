"""The analytic model against the discrete-event simulator: the paper's Figure 2 idea with the
simulator as the measurement (issue 4).

Grid: mean input x output lengths {64, 256, 1024, 4096}^2, each sweep 7 Poisson rates from 10%
to 85% of the model's saturation rate, Table I Llama-3.1-8B parameters, B = 256, M = 8192,
lengths uniform on [x/2, 3x/2]. Each point simulates one replica; requests arriving during a
warm-up (and a cool-down of the same length at the end) are not measured, both set to twice
the model's mean response time. The model is evaluated at the measured requests' mean lengths,
as the paper does. Errors are |model - sim| / sim per point, averaged per sweep and overall;
the paper's own metric (mean |model - sim| / mean sim) is reported overall as well. Also
times the paper's 44-minute load profile (Table IV) on 4 replicas for both of its scenarios.

Writes bench/results/model_vs_sim.json and bench/results/model_vs_sim.png.
Run: .venv/bin/python bench/model_vs_sim.py [--requests N] (default 3000 measured per point)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from model import PAPER_MODEL, Workload, analyze
from model.queueing.params import ServerConfig, ServiceParams
from model.queueing.variant import UNIFORM_HALF_WIDTH_CV, ModelOptions, ModelVariant
from model.simulation.simulator import Router, Simulator
from model.simulation.workloads import LengthDist, LengthKind, RateProfile, draw_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.lib.envelope import start_run, with_run  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent / "results"
LLAMA = ServiceParams(alpha_ms=6.68, beta_ms=2.01e-2, gamma_ms=5.52e-5)
SERVER = ServerConfig(max_batch_size=256, max_num_batched_tokens=8192)
LENGTHS = (64, 256, 1024, 4096)
LOAD_FRACTIONS = np.linspace(0.10, 0.85, 7)
SEED = 20260
REFINED = ModelOptions(
    variant=ModelVariant.REFINED,
    arrival_cv=1.0,
    input_length_cv=UNIFORM_HALF_WIDTH_CV,
    output_length_cv=UNIFORM_HALF_WIDTH_CV,
)
# Table III scenarios for Table IV: (name, baseline req/s, input, output).
PROFILE_SCENARIOS = (("ttft-bound", 300 / 60, 1024, 512), ("itl-bound", 120 / 60, 128, 2048))


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    """One (lengths, rate) point: simulated and predicted means (ms)."""

    input_tokens: int
    output_tokens: int
    load_fraction: float
    rate_rps: float
    measured: int
    sim_ttft_ms: float
    sim_itl_ms: float
    model_ttft_ms: float
    model_itl_ms: float
    refined_ttft_ms: float
    refined_itl_ms: float

    def error(self, metric: str, variant: str = "model") -> float:
        sim = float(getattr(self, f"sim_{metric}_ms"))
        return abs(float(getattr(self, f"{variant}_{metric}_ms")) - sim) / sim


def simulate_point(n: int, m: int, fraction: float, requests: int, seed: int) -> Point:
    workload = Workload(float(n), float(m))
    light = analyze(LLAMA, SERVER, workload, 0.0, options=PAPER_MODEL)
    rate = fraction * float(light.saturation_rate_rps)
    at_rate = analyze(LLAMA, SERVER, workload, rate, options=PAPER_MODEL)
    response_s = float(at_rate.avg_response_ms) / 1000.0
    margin_s = 2.0 * response_s
    span_s = requests / rate
    rng = np.random.default_rng(seed)
    profile = RateProfile.constant(rate, 2 * margin_s + span_s)
    lengths = LengthDist(LengthKind.UNIFORM, n), LengthDist(LengthKind.UNIFORM, m)
    trace = draw_trace(profile, *lengths, rng)
    sim = Simulator(LLAMA, SERVER)
    sim.add_requests(trace)
    res = sim.run()
    keep = (res.arrival_s > margin_s) & (res.arrival_s <= margin_s + span_s)
    seen = Workload(float(res.input_tokens[keep].mean()), float(res.output_tokens[keep].mean()))
    paper = analyze(LLAMA, SERVER, seen, rate, options=PAPER_MODEL)
    refined = analyze(LLAMA, SERVER, seen, rate, options=REFINED)
    return Point(
        input_tokens=n,
        output_tokens=m,
        load_fraction=float(fraction),
        rate_rps=rate,
        measured=int(keep.sum()),
        sim_ttft_ms=float(np.nanmean(res.ttft_ms[keep])),
        sim_itl_ms=float(np.nanmean(res.itl_ms[keep])),
        model_ttft_ms=float(paper.ttft_ms),
        model_itl_ms=float(paper.itl_ms),
        refined_ttft_ms=float(refined.ttft_ms),
        refined_itl_ms=float(refined.itl_ms),
    )


def time_profiles() -> list[dict[str, float | int | str]]:
    out: list[dict[str, float | int | str]] = []
    for name, base_rps, n, m in PROFILE_SCENARIOS:
        rng = np.random.default_rng(SEED)
        trace = draw_trace(RateProfile.paper(base_rps), LengthDist(LengthKind.UNIFORM, n),
                           LengthDist(LengthKind.UNIFORM, m), rng)
        began = time.perf_counter()
        sim = Simulator(LLAMA, SERVER, replicas=4, router=Router.LEAST_LOADED)
        sim.add_requests(trace)
        res = sim.run()
        wall_s = time.perf_counter() - began
        out.append({"scenario": name, "base_rps": base_rps, "input_tokens": n,
                    "output_tokens": m, "replicas": 4, "requests": len(trace),
                    "completed": res.completed, "iterations": res.iterations,
                    "sim_span_s": float(res.end_s), "wall_s": wall_s})
        print(f"44-min profile {name}: {len(trace)} requests, {res.iterations} iterations "
              f"on 4 replicas in {wall_s:.2f} s wall")
    return out


def plot(points: list[Point], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    for ax, metric, title in ((axes[0], "ttft", "TTFT (ms)"), (axes[1], "itl", "ITL (ms)")):
        for n in LENGTHS:
            sel = [p for p in points if p.input_tokens == n]
            ax.scatter([getattr(p, f"sim_{metric}_ms") for p in sel],
                       [getattr(p, f"model_{metric}_ms") for p in sel], s=14, label=f"n = {n}")
        values = [getattr(p, f"{k}_{metric}_ms") for p in points for k in ("sim", "model")]
        lo, hi = min(values) / 1.5, max(values) * 1.5
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="y = x")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), title=title,
               xlabel="simulated", ylabel="predicted (paper model)")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(ScalarFormatter())
            axis.set_minor_formatter(NullFormatter())
        ax.legend(fontsize=8)
    fig.suptitle("Analytic model vs discrete-event simulator (Llama-3.1-8B, B=256, M=8192)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="measured requests per point")
    args = parser.parse_args()
    run_start = start_run()
    began = time.perf_counter()
    points: list[Point] = []
    sweeps: list[dict[str, float | int]] = []
    print(f"{'n':>5} {'m':>5} | TTFT err  ITL err | refined: TTFT err  ITL err | wall s")
    for i, n in enumerate(LENGTHS):
        for j, m in enumerate(LENGTHS):
            t0 = time.perf_counter()
            sweep = [simulate_point(n, m, f, args.requests, SEED + 100 * (4 * i + j) + k)
                     for k, f in enumerate(LOAD_FRACTIONS)]
            points.extend(sweep)
            row: dict[str, float | int] = {"input_tokens": n, "output_tokens": m}
            for variant in ("model", "refined"):
                for metric in ("ttft", "itl"):
                    row[f"{variant}_{metric}_error"] = float(
                        np.mean([p.error(metric, variant) for p in sweep]))
            sweeps.append(row)
            print(f"{n:>5} {m:>5} | {row['model_ttft_error']:7.1%} {row['model_itl_error']:7.1%}"
                  f" |          {row['refined_ttft_error']:7.1%} {row['refined_itl_error']:7.1%}"
                  f" | {time.perf_counter() - t0:6.1f}")
    overall: dict[str, float] = {}
    for variant in ("model", "refined"):
        for metric in ("ttft", "itl"):
            errs = [p.error(metric, variant) for p in points]
            sim = np.array([getattr(p, f"sim_{metric}_ms") for p in points])
            pred = np.array([getattr(p, f"{variant}_{metric}_ms") for p in points])
            overall[f"{variant}_{metric}_error"] = float(np.mean(errs))
            overall[f"{variant}_{metric}_paper_metric"] = float(
                np.sum(np.abs(pred - sim)) / np.sum(sim))
    print(f"overall (mean relative error): TTFT {overall['model_ttft_error']:.1%}, "
          f"ITL {overall['model_itl_error']:.1%}; refined: TTFT "
          f"{overall['refined_ttft_error']:.1%}, ITL {overall['refined_itl_error']:.1%}")
    print(f"overall (paper metric, mean |err| / mean sim): TTFT "
          f"{overall['model_ttft_paper_metric']:.1%}, ITL {overall['model_itl_paper_metric']:.1%}")
    grid_wall_s = time.perf_counter() - began
    profiles = time_profiles()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    plot(points, RESULTS_DIR / "model_vs_sim.png")
    result = {
        "params": LLAMA.to_dict(),
        "server": SERVER.to_dict(),
        "load_fractions": [float(f) for f in LOAD_FRACTIONS],
        "requests_per_point": args.requests,
        "seed": SEED,
        "overall": overall,
        "sweeps": sweeps,
        "points": [asdict(p) for p in points],
        "grid_wall_s": grid_wall_s,
        "paper_profile_4_replicas": profiles,
    }
    out = RESULTS_DIR / "model_vs_sim.json"
    out.write_text(json.dumps(with_run(run_start, result), indent=1, allow_nan=False) + "\n")
    print(f"wrote {out} and model_vs_sim.png; grid took {grid_wall_s:.0f} s")
    if any(math.isnan(v) for v in overall.values()):
        raise SystemExit("NaN errors: some point had no measured request")


if __name__ == "__main__":
    main()
