"""Sizing on mean targets only returns the results recorded before percentile targets existed
(tests/data/mean-sizing-baseline.json; see mean_sizing_cases.py): every rate, status, binding and
replica count bit-identical; the latencies predicted at those rates within 1e-12 relative (the
compiled kernel sums the chain in another order than numpy did, which moves them by an ulp or
two; tests/model/queueing/test_kernel_numerics.py holds `analyze` to the numpy model)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.model.queueing.mean_sizing_cases import BASELINE_PATH, VARIANTS, run_case

RECORDED = json.loads(BASELINE_PATH.read_text())["cases"]
PREDICTED = ("ttft_ms", "itl_ms")  # the model's outputs at the sizing rate, not search results
PREDICTION_RTOL = 1e-12


def _split(result: dict[str, Any]) -> tuple[dict[str, Any], list[float]]:
    """(the result without its predicted latencies, those latencies as floats)."""
    exact = {k: v for k, v in result.items() if k not in (*PREDICTED, "plans")}
    predicted = [float.fromhex(result[k]) for k in PREDICTED]
    exact["plans"] = []
    for plan in result["plans"]:
        exact["plans"].append({k: v for k, v in plan.items() if k not in PREDICTED})
        predicted += [float.fromhex(plan[k]) for k in PREDICTED if plan[k] is not None]
    return exact, predicted


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=f"{c['id']}-{c['variant']}") for c in RECORDED]
)
def test_mean_only_sizing_matches_the_recording(case: dict[str, Any]) -> None:
    got_exact, got_predicted = _split(run_case(case["input"], VARIANTS[case["variant"]]))
    want_exact, want_predicted = _split(case["result"])
    assert got_exact == want_exact
    assert got_predicted == pytest.approx(want_predicted, rel=PREDICTION_RTOL)


def test_the_recording_covers_golden_and_bench_cases_in_every_variant() -> None:
    ids = {c["id"] for c in RECORDED}
    assert {"S02_llama_ttftbound_slo_Q100", "R01_llama_ttftbound_replicas", "soak"} <= ids
    assert {c["variant"] for c in RECORDED} == set(VARIANTS)
