"""Mean-target sizing cases whose results are pinned bit for bit in
tests/data/mean-sizing-baseline.json.

The file was written by `python -m tests.model.queueing.mean_sizing_cases` from the code as it
was before percentile targets were added to sizing (the refined variants' cases re-recorded with
`run_case` when the refined mean TTFT took the prefill-work queue, the paper's kept);
tests/model/queueing/test_mean_sizing_pinned.py recomputes every case and compares the floats
exactly (as hex strings). Cases: every golden `size` and `replicas` case, the sizing calls of
bench/model_speed.py, bench/soak.py and bench/closed_loop.py's scenarios, each under the paper
variant, the default (refined, Poisson) variant and the refined variant with constant-rate
arrivals and uniform length spread.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from model import (
    DEFAULT_MODEL,
    PAPER_MODEL,
    ModelOptions,
    ServerConfig,
    ServiceParams,
    Workload,
    max_rate_for_slo,
    replicas_for_slo,
)
from model.queueing.variant import UNIFORM_HALF_WIDTH_CV
from tests.conftest import DATA_DIR, load_golden_cases

BASELINE_PATH = DATA_DIR / "mean-sizing-baseline.json"
VARIANTS: dict[str, ModelOptions] = {
    "paper": PAPER_MODEL,
    "default": DEFAULT_MODEL,
    "refined_constant_uniform": ModelOptions(
        arrival_cv=0.0,
        input_length_cv=UNIFORM_HALF_WIDTH_CV,
        output_length_cv=UNIFORM_HALF_WIDTH_CV,
    ),
}
_LLAMA = {"alpha": 6.68, "beta": 2.01e-2, "gamma": 5.52e-5}


def _bench_cases() -> list[dict[str, Any]]:
    def case(name: str, n: float, m: float, big_b: int, ttft: float | None, itl: float | None,
             totals: list[float]) -> dict[str, Any]:
        return {"id": name, "input": {**_LLAMA, "n": n, "m": m, "max_batch_size": big_b,
                                      "max_num_tokens": 8192, "max_queue_size": None,
                                      "ttft_target_ms": ttft, "itl_target_ms": itl,
                                      "totals_rps": totals}}

    return [
        case("model_speed_b256", 1024, 512, 256, 50.0, 25.0, [20.0]),
        case("model_speed_b1024", 1024, 512, 1024, 50.0, 25.0, [20.0]),
        case("soak", 512, 128, 256, 60.0, 20.0, [1.0, 7.5, 30.0]),
        case("closed_loop_ttft_bound", 1024, 512, 256, 50.0, 25.0, [5.0, 12.5, 20.0]),
        case("closed_loop_itl_bound", 128, 2048, 256, 200.0, 13.0, [2.0, 5.0, 8.0]),
        case("ttft_only", 4096, 64, 256, 300.0, None, [10.0]),
        case("itl_only", 256, 1024, 256, None, 12.0, [10.0]),
        case("no_target", 64, 4096, 256, None, None, [3.0]),
    ]


def _golden_cases() -> list[dict[str, Any]]:
    out = []
    for c in load_golden_cases():
        if c["kind"] not in ("size", "replicas"):
            continue
        inp = dict(c["input"])
        inp["ttft_target_ms"] = inp["ttft_target_ms"] or None  # the file's 0 = ignored
        inp["itl_target_ms"] = inp["itl_target_ms"] or None
        inp["totals_rps"] = [rpm / 60.0 for rpm in inp.get("total_rpm", [])]
        out.append({"id": c["id"], "input": inp})
    return out


def all_cases() -> list[dict[str, Any]]:
    """Every pinned case: its id and input (targets None where absent; totals in req/s)."""
    return _golden_cases() + _bench_cases()


def run_case(inp: dict[str, Any], options: ModelOptions) -> dict[str, Any]:
    """Sizing results of one case under one variant; floats as hex strings (exact)."""
    params = ServiceParams(inp["alpha"], inp["beta"], inp["gamma"])
    server = ServerConfig(
        max_batch_size=inp["max_batch_size"],
        max_num_batched_tokens=inp["max_num_tokens"],
        max_queue_size=inp.get("max_queue_size"),
    )
    workload = Workload(inp["n"], inp["m"])
    ttft, itl = inp["ttft_target_ms"], inp["itl_target_ms"]
    cap = max_rate_for_slo(params, server, workload, ttft, itl, options=options)
    out: dict[str, Any] = {
        "feasible": cap.feasible,
        "status": str(cap.status),
        "binding": str(cap.binding),
        **{
            name: float(getattr(cap, name)).hex()
            for name in ("rate_rps", "rate_ttft_rps", "rate_itl_rps", "max_rate_rps",
                         "min_rate_rps")
        },
        "ttft_ms": float(cap.analysis.ttft_ms).hex(),
        "itl_ms": float(cap.analysis.itl_ms).hex(),
        "plans": [],
    }
    for total in inp["totals_rps"]:
        plan = replicas_for_slo(total, params, server, workload, ttft, itl, options=options)
        out["plans"].append({
            "total_rps": float(total).hex(),
            "status": str(plan.status),
            "replicas": plan.replicas,
            "per_replica_rate_rps": _hex(plan.per_replica_rate_rps),
            "ttft_ms": _hex(plan.ttft_ms),
            "itl_ms": _hex(plan.itl_ms),
        })
    return out


def _hex(value: float | None) -> str | None:
    return None if value is None else float(value).hex()


def record() -> dict[str, Any]:
    return {
        "note": (
            "Mean-target sizing results recorded before percentile targets were added to "
            "sizing, by `python -m tests.model.queueing.mean_sizing_cases`; floats are "
            "float.hex() strings and must stay bit-identical."
        ),
        "cases": [
            {"id": c["id"], "variant": name, "input": c["input"],
             "result": run_case(c["input"], options)}
            for c in all_cases()
            for name, options in VARIANTS.items()
        ],
    }


def main() -> None:
    Path(BASELINE_PATH).write_text(json.dumps(record(), indent=1) + "\n")
    print(f"wrote {BASELINE_PATH}")


if __name__ == "__main__":
    main()
