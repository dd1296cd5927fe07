"""Speed of the model's hot paths: prints a table and writes bench/results/model_speed.json.

Goals on a 2-core machine: scalar analyze <= 50 us, a 1000-rate curve <= 5 ms,
max_rate_for_slo <= 1 ms (B = 256); latency_quantiles <= 1 ms per rate (B = 256, 64 rates in one
call) and max_rate_for_slo with a TTFT p95 and a per-token ITL p99 target <= 20 ms (B = 256).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model import (  # noqa: E402
    PAPER_MODEL,
    LatencyMetric,
    PercentileTarget,
    ServerConfig,
    ServiceParams,
    Workload,
    analyze,
    latency_quantiles,
    max_rate,
    max_rate_for_slo,
    replicas_for_slo,
)
from model.queueing.analyzer import analyze_points  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
QUANTILE_RATES = 64  # rates per latency_quantiles call; its row reports the time per rate
PERCENTILE_TARGETS = (
    PercentileTarget(LatencyMetric.TTFT, 0.95, 100.0),
    PercentileTarget(LatencyMetric.ITL_PER_TOKEN, 0.99, 40.0),
)
LLAMA = ServiceParams(6.68, 2.01e-2, 5.52e-5)  # paper Table I, ms
SHAPE = Workload(1024, 512)


def median_us(fn: Callable[[], object], repeats: int = 7, min_time_s: float = 0.2) -> float:
    """Median over `repeats` batches of the per-call time, in microseconds."""
    fn()
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if time.perf_counter() - start >= min_time_s / repeats:
            break
        calls *= 2
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def main() -> None:
    b256, b1024 = ServerConfig(max_batch_size=256), ServerConfig(max_batch_size=1024)
    curve = np.linspace(0.0, max_rate(LLAMA, b256, SHAPE), 1000)
    rng = np.random.default_rng(7)
    n_pts, m_pts = rng.uniform(128, 4096, 10), rng.uniform(64, 2048, 10)
    r_pts = rng.uniform(0.2, 2.0, 10)
    quantile_rates = np.linspace(0.05, 0.95, QUANTILE_RATES) * max_rate(LLAMA, b256, SHAPE)
    cases: list[tuple[str, Callable[[], object], float | None]] = [
        ("analyze scalar, B=256", lambda: analyze(LLAMA, b256, SHAPE, 5.0), 50.0),
        (
            "analyze scalar, B=256, paper variant",
            lambda: analyze(LLAMA, b256, SHAPE, 5.0, options=PAPER_MODEL),
            50.0,
        ),
        ("analyze scalar, B=1024", lambda: analyze(LLAMA, b1024, SHAPE, 5.0), None),
        ("analyze 1000 rates, B=256", lambda: analyze(LLAMA, b256, SHAPE, curve), 5000.0),
        (
            "analyze_points 10 shapes, B=256",
            lambda: analyze_points(LLAMA, b256, n_pts, m_pts, r_pts),
            None,
        ),
        (
            "max_rate_for_slo, B=256",
            lambda: max_rate_for_slo(LLAMA, b256, SHAPE, ttft_ms=50, itl_ms=25),
            1000.0,
        ),
        (
            "max_rate_for_slo, B=256, paper variant",
            lambda: max_rate_for_slo(
                LLAMA, b256, SHAPE, ttft_ms=50, itl_ms=25, options=PAPER_MODEL
            ),
            1000.0,
        ),
        (
            "max_rate_for_slo, B=1024",
            lambda: max_rate_for_slo(LLAMA, b1024, SHAPE, ttft_ms=50, itl_ms=25),
            None,
        ),
        (
            "replicas_for_slo, B=256",
            lambda: replicas_for_slo(20.0, LLAMA, b256, SHAPE, ttft_ms=50, itl_ms=25),
            None,
        ),
        (
            f"latency_quantiles per rate ({QUANTILE_RATES} rates), B=256",
            lambda: latency_quantiles(LLAMA, b256, SHAPE, quantile_rates, [0.5, 0.9, 0.95, 0.99]),
            1000.0 * QUANTILE_RATES,
        ),
        (
            "latency_quantiles scalar, B=256",
            lambda: latency_quantiles(LLAMA, b256, SHAPE, 5.0, [0.5, 0.9, 0.95, 0.99]),
            None,
        ),
        (
            "max_rate_for_slo TTFT p95 + token ITL p99, B=256",
            lambda: max_rate_for_slo(LLAMA, b256, SHAPE, percentiles=PERCENTILE_TARGETS),
            20000.0,
        ),
    ]
    rows = []
    print("default model variant: refined (rows marked 'paper variant' pin the paper's)")
    load_1min = os.getloadavg()[0]
    print(f"machine load average (1 min) at start: {load_1min:.1f} on {os.cpu_count()} cores")
    print(f"{'case':48s} {'median':>12s} {'goal':>10s}  verdict")
    for name, fn, goal in cases:
        us = median_us(fn)
        if name.startswith("latency_quantiles per rate"):
            us, goal = us / QUANTILE_RATES, None if goal is None else goal / QUANTILE_RATES
        verdict = "" if goal is None else ("met" if us <= goal else "MISSED")
        goal_text = "-" if goal is None else f"{goal:,.0f} us"
        print(f"{name:50s} {us:10,.1f} us {goal_text:>10s}  {verdict}")
        rows.append({"case": name, "median_us": us, "goal_us": goal, "met": verdict == "met"})
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {
        "benchmark": "model_speed",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
        "load_average_1min": load_1min,
        "results": rows,
    }
    (RESULTS / "model_speed.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS / 'model_speed.json'}")


if __name__ == "__main__":
    main()
