"""`analyze` outputs recorded before the model's kernel was compiled, in
tests/data/analyze-baseline.json.

The file was written by `python -m tests.model.queueing.analyze_cases` from the numpy model
(before model/queueing/kernel/*.py); the refined option sets' rows were re-recorded with
`run_case` and `run_points` when the refined mean TTFT took the prefill-work queue and the
prompts joining a step (the paper variant's rows are the numpy model's).
tests/model/queueing/test_kernel_numerics.py recomputes every case and compares each output
within 1e-9 relative. Cases: random request shapes, batch
sizes 1 to 4096, token budgets that make the chunk count vary, rates from 0 to past
saturation, each under the paper variant, the default one, constant-rate arrivals with length
spread, bursty arrivals with a prefix-cache hit ratio and an architecture, and a finite waiting
room; plus the tuner's multi-shape path (`analyze_points`) with synchronous points.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from model import (
    DEFAULT_MODEL,
    PAPER_MODEL,
    ModelOptions,
    ServerConfig,
    ServiceParams,
    Workload,
    analyze,
    analyze_points,
)
from model.queueing.variant import LLAMA_3_1_8B, UNIFORM_HALF_WIDTH_CV
from tests.conftest import DATA_DIR

BASELINE_PATH = DATA_DIR / "analyze-baseline.json"
VARIANTS: dict[str, ModelOptions] = {
    "paper": PAPER_MODEL,
    "default": DEFAULT_MODEL,
    "constant_uniform": ModelOptions(
        arrival_cv=0.0,
        input_length_cv=UNIFORM_HALF_WIDTH_CV,
        output_length_cv=UNIFORM_HALF_WIDTH_CV,
    ),
    "bursty_cached": ModelOptions(
        arrival_cv=2.0,
        input_length_cv=1.0,
        output_length_cv=0.7,
        prefix_hit_ratio=0.4,
        architecture=LLAMA_3_1_8B,
    ),
    "mixed_arrivals": ModelOptions(arrival_cv=0.6, input_length_cv=0.3),
}
FIELDS = (
    "stable", "offered_rate_rps", "throughput_rps", "ttft_ms", "itl_ms", "avg_wait_ms",
    "avg_prefill_ms", "avg_service_ms", "avg_response_ms", "avg_num_in_system",
    "avg_batch_size", "avg_queue_length", "utilization", "busy_prob", "wait_prob",
    "blocking_prob", "chunks", "max_rate_rps", "saturation_rate_rps",
)  # fmt: skip


def cases() -> list[dict[str, Any]]:
    """Inputs: a fixed random draw of shapes, servers and rates (fractions of saturation)."""
    rng = np.random.default_rng(20261202)
    out: list[dict[str, Any]] = []
    for k in range(40):
        big_b = int(rng.choice([1, 2, 7, 64, 256, 1024, 4096]))
        out.append({
            "id": f"c{k:02d}",
            "alpha": float(rng.uniform(2.0, 20.0)),
            "beta": float(10 ** rng.uniform(-3.0, -1.0)),
            "gamma": float(10 ** rng.uniform(-6.0, -4.0)),
            "n": float(rng.choice([0.0, 1.0, 37.0, 512.0, 3000.0, 16000.0])),
            "m": float(rng.choice([1.0, 2.0, 64.0, 700.0, 4096.0])),
            "max_batch_size": big_b,
            "max_num_tokens": int(rng.choice([512, 2048, 8192, 65536])),
            "max_queue_size": None if k % 5 else int(rng.choice([0, 3, 100])),
            # Fractions of the saturation rate: 0, light, moderate, heavy, past it.
            "loads": [0.0, 1e-4, float(rng.uniform(0.05, 0.5)), float(rng.uniform(0.5, 0.95)),
                      0.999, 1.3],
        })  # fmt: skip
    return out


def run_case(case: dict[str, Any], options: ModelOptions) -> list[list[Any]]:
    """Every Analysis field at each rate of the case: one row per rate, FIELDS order."""
    params = ServiceParams(case["alpha"], case["beta"], case["gamma"])
    server = ServerConfig(case["max_batch_size"], case["max_num_tokens"], case["max_queue_size"])
    workload = Workload(case["n"], case["m"])
    sat = analyze(params, server, workload, 0.0, options=options).saturation_rate_rps
    rates = [load * sat for load in case["loads"]]
    rows = []
    for rate in rates:  # one rate at a time (the scalar path) ...
        res = analyze(params, server, workload, rate, options=options)
        rows.append([getattr(res, name) for name in FIELDS])
    arr = analyze(params, server, workload, np.array(rates), options=options)  # ... and arrays
    rows += [[np.asarray(getattr(arr, name))[j].item() for name in FIELDS]
             for j in range(len(rates))]  # fmt: skip
    return rows


def run_points(options: ModelOptions) -> list[list[Any]]:
    """`analyze_points` on eight shapes at once, two of them synchronous."""
    params = ServiceParams(6.68, 2.01e-2, 5.52e-5)
    server = ServerConfig(max_batch_size=256)
    n = np.array([128.0, 1024.0, 4096.0, 256.0, 2048.0, 64.0, 512.0, 1024.0])
    m = np.array([512.0, 256.0, 64.0, 1024.0, 128.0, 32.0, 700.0, 1.0])
    light = analyze_points(params, server, n, m, np.full(8, 1e-3), options=options)
    rates = np.array([0.1, 0.3, 0.5, 0.7, 0.9, 0.2, 0.6, 0.4]) * light.saturation_rate_rps
    sync = np.array([False, True, False, False, False, True, False, False])
    res = analyze_points(params, server, n, m, rates, options=options, synchronous=sync)
    return [[np.asarray(getattr(res, name))[j].item() for name in FIELDS] for j in range(8)]


def record() -> dict[str, Any]:
    out: dict[str, Any] = {"fields": list(FIELDS), "cases": [], "points": {}}
    for case in cases():
        for variant, options in VARIANTS.items():
            out["cases"].append(
                {"id": case["id"], "variant": variant, "input": case,
                 "rows": run_case(case, options)}
            )  # fmt: skip
    for variant, options in VARIANTS.items():
        out["points"][variant] = run_points(options)
    return out


if __name__ == "__main__":
    BASELINE_PATH.write_text(json.dumps(record(), indent=1) + "\n")
    print(f"wrote {BASELINE_PATH}")
