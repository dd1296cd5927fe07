"""Percentile outputs recorded before the sample assembly was compiled, in
tests/data/percentile-baseline.json.

The file was written by `python -m tests.model.queueing.percentile_cases` from the numpy
assembly (model/queueing/latency_samples.py as it stood before kernel_assembly.py);
tests/model/queueing/test_percentile_numerics.py recomputes every case and compares within
1e-9 relative. Cases: the request shapes, servers and loads of analyze_cases.py (B = 1 to 4096,
finite waiting rooms, 0 to past saturation) under its five option sets, with both first-token
conventions: `latency_quantiles` at each load (one rate at a time and all at once), and
`max_rate_for_slo` on two target sets placed between the light-load quantile and ten times it,
so that the percentile targets bind inside the search, mean targets bind beside them, or none
can be met.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from model import (
    FirstToken,
    LatencyMetric,
    ModelOptions,
    PercentileTarget,
    ServerConfig,
    ServiceParams,
    Workload,
    analyze,
    latency_quantiles,
    max_rate_for_slo,
)
from tests.conftest import DATA_DIR
from tests.model.queueing.analyze_cases import VARIANTS, cases

BASELINE_PATH = DATA_DIR / "percentile-baseline.json"
QUANTILES = (0.01, 0.1, 0.5, 0.9, 0.95, 0.99, 0.999)
QUANTILE_FIELDS = ("ttft_ms", "itl_per_token_ms", "itl_per_request_ms")
MEAN_FIELDS = ("mean_ttft_ms", "mean_itl_per_token_ms", "mean_itl_per_request_ms")
# Target sets: (metric, quantile, multiple of the light-load quantile) and mean targets as
# multiples of the light-load mean TTFT / ITL (None: no mean target).
TARGET_SETS: tuple[tuple[tuple[tuple[LatencyMetric, float], ...], float | None], ...] = (
    (((LatencyMetric.TTFT, 0.95), (LatencyMetric.ITL_PER_TOKEN, 0.99)), None),
    (((LatencyMetric.ITL_PER_REQUEST, 0.9), (LatencyMetric.TTFT, 0.5)), 1.5),
)


def _setup(case: dict[str, Any]) -> tuple[ServiceParams, ServerConfig, Workload]:
    params = ServiceParams(case["alpha"], case["beta"], case["gamma"])
    server = ServerConfig(case["max_batch_size"], case["max_num_tokens"], case["max_queue_size"])
    return params, server, Workload(case["n"], case["m"])


def first_token_of(k: int) -> FirstToken:
    """The convention a case runs under: the two alternate over the cases."""
    return list(FirstToken)[k % 2]


def run_quantiles(
    case: dict[str, Any], options: ModelOptions, first: FirstToken
) -> list[list[float]]:
    """Per load, one rate at a time then all at once: each quantile field's row, then the means."""
    params, server, workload = _setup(case)
    sat = analyze(params, server, workload, 0.0, options=options).saturation_rate_rps
    rates = [load * sat for load in case["loads"]]
    rows = []
    for rate in rates:
        one = latency_quantiles(params, server, workload, rate, QUANTILES, options=options,
                                first_token=first)  # fmt: skip
        rows.append([float(v) for f in QUANTILE_FIELDS for v in getattr(one, f)]
                    + [float(getattr(one, f)) for f in MEAN_FIELDS])  # fmt: skip
    arr = latency_quantiles(params, server, workload, np.array(rates), QUANTILES,
                            options=options, first_token=first)  # fmt: skip
    for j in range(len(rates)):
        rows.append([float(v) for f in QUANTILE_FIELDS for v in getattr(arr, f)[j]]
                    + [float(getattr(arr, f)[j]) for f in MEAN_FIELDS])  # fmt: skip
    return rows


def run_sizing(
    case: dict[str, Any], options: ModelOptions, first: FirstToken, scale: float
) -> list[list[Any]]:
    """Per target set: feasible, rate (req/s), binding name and attainment, with every target
    `scale` times its light-load value."""
    params, server, workload = _setup(case)
    sat = analyze(params, server, workload, 0.0, options=options).saturation_rate_rps
    light_rate = 1e-3 * sat
    light = latency_quantiles(params, server, workload, light_rate, QUANTILES, options=options,
                              first_token=first)  # fmt: skip
    mean = analyze(params, server, workload, light_rate, options=options)
    field = dict(zip(LatencyMetric, QUANTILE_FIELDS, strict=True))
    out: list[list[Any]] = []
    for spec, mean_scale in TARGET_SETS:
        targets = [
            PercentileTarget(metric, q, scale * float(
                getattr(light, field[metric])[QUANTILES.index(q)]))
            for metric, q in spec
        ]  # fmt: skip
        itl = None if mean_scale is None else mean_scale * scale * mean.itl_ms
        res = max_rate_for_slo(params, server, workload, itl_ms=itl, options=options,
                               percentiles=targets, first_token=first)  # fmt: skip
        out.append([res.feasible, res.rate_rps, res.binding_name, list(res.attainment)])
    return out


def sizing_scale(k: int) -> float:
    """Targets 1.05 to 10 times their light-load value, spread over the cases."""
    return float(1.05 * (10.0 / 1.05) ** ((k * 7 % 40) / 39.0))


def record() -> dict[str, Any]:
    out: dict[str, Any] = {"quantiles": list(QUANTILES), "cases": []}
    for k, case in enumerate(cases()):
        first = first_token_of(k)
        for variant, options in VARIANTS.items():
            out["cases"].append({
                "id": case["id"], "variant": variant, "first_token": first.value,
                "quantile_rows": run_quantiles(case, options, first),
                "sizing_scale": sizing_scale(k),
                "sizing": run_sizing(case, options, first, sizing_scale(k)),
            })  # fmt: skip
    return out


if __name__ == "__main__":
    BASELINE_PATH.write_text(json.dumps(record(), indent=1) + "\n")
    print(f"wrote {BASELINE_PATH}")
