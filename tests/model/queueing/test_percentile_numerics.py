"""The compiled sample assembly against the numpy one it replaced: every recorded quantile and
mean (tests/data/percentile-baseline.json, see percentile_cases.py) within 1e-9 relative,
infinities exactly; every recorded sizing answer's rate within 1e-9 relative, its feasibility
and binding target exactly, its attainment (a share of the 1024 sample points) exactly."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from model import FirstToken
from model.queueing.kernel import latency as kernel_latency
from model.queueing.kernel.samples import count_at
from tests.model.queueing.analyze_cases import VARIANTS, cases
from tests.model.queueing.percentile_cases import BASELINE_PATH, run_quantiles, run_sizing

RECORDED = json.loads(BASELINE_PATH.read_text())
INPUTS = {case["id"]: case for case in cases()}
RTOL = 1e-9


def _close(value: float, expected: float) -> bool:
    if math.isinf(expected):
        return value == expected
    return value == pytest.approx(expected, rel=RTOL, abs=1e-280)


def _param(case: dict[str, Any]) -> Any:
    return pytest.param(case, id=f"{case['id']}-{case['variant']}")


@pytest.mark.parametrize("case", [_param(c) for c in RECORDED["cases"]])
def test_quantiles_match_the_numpy_assembly(case: dict[str, Any]) -> None:
    got = run_quantiles(INPUTS[case["id"]], VARIANTS[case["variant"]],
                        FirstToken(case["first_token"]))  # fmt: skip
    assert len(got) == len(case["quantile_rows"])
    for j, (row, ref) in enumerate(zip(got, case["quantile_rows"], strict=True)):
        bad = [(k, v, e) for k, (v, e) in enumerate(zip(row, ref, strict=True)) if not _close(v, e)]
        assert not bad, f"row {j}: (column, got, recorded) {bad}"


@pytest.mark.parametrize("case", [_param(c) for c in RECORDED["cases"]])
def test_sizing_matches_the_numpy_assembly(case: dict[str, Any]) -> None:
    got = run_sizing(INPUTS[case["id"]], VARIANTS[case["variant"]],
                     FirstToken(case["first_token"]), case["sizing_scale"])  # fmt: skip
    for (feasible, rate, binding, attainment), ref in zip(got, case["sizing"], strict=True):
        assert (feasible, binding, attainment) == (ref[0], ref[2], ref[3])
        assert _close(rate, ref[1]), (rate, ref[1])


def test_the_recording_covers_binding_percentiles_means_and_infeasibility() -> None:
    bindings = {(s[0], s[2]) for c in RECORDED["cases"] for s in c["sizing"]}
    assert {(True, "ttft_p95"), (True, "itl_per_token_p99"), (True, "ttft_p50"),
            (True, "itl_mean"), (True, "max_rate")} <= bindings  # fmt: skip
    assert any(not feasible for feasible, _ in bindings)
    rows = [v for c in RECORDED["cases"] for row in c["quantile_rows"] for v in row]
    assert any(math.isinf(v) for v in rows) and any(math.isfinite(v) for v in rows)
    assert {c["first_token"] for c in RECORDED["cases"]} == {f.value for f in FirstToken}


def test_the_zero_count_shortcut_agrees_with_the_term_by_term_count() -> None:
    # Near exp(-mean) = u the exp's and the log's last bits decide: the shortcut must leave
    # those points to the term-by-term count (with its margin on the wrong side of log u it
    # calls counts of 1 zero, within 1e-9 relative of the boundary).
    levels = np.random.default_rng(5).uniform(1e-12, 1.0 - 1e-12, 3000)
    logs = np.log(levels)
    for step in (-1e-9, -4e-16, -1e-16, 0.0, 1e-16, 4e-16, 1e-10, 1e-9):
        for u, log_u in zip(levels, logs, strict=True):
            mean = max(-log_u * (1.0 + step), 0.0)
            got = kernel_latency._poisson(mean, u, log_u, 0.0)
            assert got == count_at(mean, u, 0.0, kernel_latency.NORMAL_ABOVE), (mean, u)
