"""What percentile targets add to a deployment's cycle: the recommender's forecast (sizing for
the load and predicting at the current replicas) with mean targets only, against the same with a
TTFT p95 and a per-token ITL p99 target, B = 256, in the same process. Prints the medians and
writes bench/results/percentile_cycle_cost.json.

A cycle sizes once per deployment: one percentile search (inside replicas_for_slo) and one
latency_quantiles call at the current per-replica rate.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.lib.envelope import start_run, with_run  # noqa: E402
from bench.model_speed import LLAMA as LLAMA_MS  # noqa: E402
from bench.model_speed import median_us  # noqa: E402
from exporter.config.values import DeploymentConfig, SloConfig, SourceConfig  # noqa: E402
from exporter.sizing.recommender import forecast  # noqa: E402
from model import LatencyMetric, PercentileTarget, ServerConfig, ServiceParams, Workload  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
LLAMA = ServiceParams(*LLAMA_MS)
SHAPE = Workload(1024, 512)
PERCENTILE_TARGETS = (
    PercentileTarget(LatencyMetric.TTFT, 0.95, 100.0),
    PercentileTarget(LatencyMetric.ITL_PER_TOKEN, 0.99, 40.0),
)
MIN_TIME_S = 0.5  # per timed batch


def deployment(slo: SloConfig) -> DeploymentConfig:
    return DeploymentConfig(
        name="llama",
        model_name="llama",
        source=SourceConfig(scrape_urls=("http://127.0.0.1:1/metrics",)),
        server=ServerConfig(max_batch_size=256),
        slo=slo,
    )


def main() -> None:
    arms = {
        "mean targets (TTFT 100 ms, ITL 40 ms)": SloConfig(ttft_ms=100.0, itl_ms=40.0),
        "mean + TTFT p95 + token ITL p99": SloConfig(
            ttft_ms=100.0, itl_ms=40.0, percentiles=PERCENTILE_TARGETS
        ),
    }
    run_start = start_run()
    load_1min = os.getloadavg()[0]
    print(f"machine load average (1 min) at start: {load_1min:.1f} on {os.cpu_count()} cores")
    rows = []
    for name, slo in arms.items():
        dep = deployment(slo)
        us = median_us(
            lambda dep=dep: forecast(  # type: ignore[misc]
                dep, LLAMA, SHAPE, (0.1, 0.05), size_for_rps=20.0, per_replica_rps=5.0
            ),
            MIN_TIME_S,
        )
        print(f"{name:40s} {us / 1000:8.2f} ms per deployment and cycle")
        rows.append({"case": name, "median_us": us})
    ratio = rows[1]["median_us"] / rows[0]["median_us"]
    print(f"percentile targets cost {ratio:.1f} x the mean-only forecast")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = with_run(run_start, {
        "benchmark": "percentile_cycle_cost",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "load_average_1min": load_1min,
        "results": rows,
        "ratio": ratio,
    })
    (RESULTS / "percentile_cycle_cost.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS / 'percentile_cycle_cost.json'}")


if __name__ == "__main__":
    main()
