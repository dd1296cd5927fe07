"""The compiled kernel against the numpy model it replaced: every `analyze` output of the
recorded cases (tests/data/analyze-baseline.json, see analyze_cases.py) within 1e-9 relative,
flags, chunk counts and infinities exactly."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from model.queueing.analyzer import analyze, analyze_points, point_latencies
from model.queueing.params import ServerConfig, ServiceParams, Workload
from tests.model.queueing.analyze_cases import BASELINE_PATH, VARIANTS, run_case, run_points

RECORDED = json.loads(BASELINE_PATH.read_text())
FIELDS = RECORDED["fields"]
RTOL = 1e-9
# Values this small are rounding residue of a difference (a probability of 1e-300, a wait of
# 1e-290 ms): compared in absolute terms.
ATOL = 1e-280


def _assert_rows_close(got: list[list[Any]], want: list[list[Any]]) -> None:
    assert len(got) == len(want)
    for j, (row, ref) in enumerate(zip(got, want, strict=True)):
        for name, value, expected in zip(FIELDS, row, ref, strict=True):
            where = f"rate {j}, {name}: got {value!r}, recorded {expected!r}"
            if isinstance(expected, bool) or name == "chunks":
                assert value == expected, where
            elif math.isinf(expected) or math.isnan(expected):
                assert value == expected or (math.isnan(value) and math.isnan(expected)), where
            else:
                assert value == pytest.approx(expected, rel=RTOL, abs=ATOL), where


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=f"{c['id']}-{c['variant']}") for c in RECORDED["cases"]]
)
def test_analyze_matches_the_numpy_model(case: dict[str, Any]) -> None:
    _assert_rows_close(run_case(case["input"], VARIANTS[case["variant"]]), case["rows"])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_analyze_points_matches_the_numpy_model(variant: str) -> None:
    _assert_rows_close(run_points(VARIANTS[variant]), RECORDED["points"][variant])


def test_the_recording_covers_large_batches_queues_and_overload() -> None:
    inputs = [c["input"] for c in RECORDED["cases"]]
    assert {1, 4096} <= {c["max_batch_size"] for c in inputs}
    assert any(c["max_queue_size"] is not None for c in inputs)
    stable = [row[FIELDS.index("stable")] for c in RECORDED["cases"] for row in c["rows"]]
    assert True in stable and False in stable


def test_a_point_evaluates_the_same_alone_or_among_others() -> None:
    # Points are evaluated one table row at a time in a scratch row (kernel_mean.point_outputs):
    # neither the other points nor the other parameter vectors of the call leave a trace.
    server = ServerConfig(max_batch_size=64, max_num_batched_tokens=1024, max_queue_size=None)
    n, m = np.array([900.0, 64.0, 3000.0]), np.array([200.0, 16.0, 700.0])
    theta = np.array([[6.68, 2.01e-2, 5.52e-5], [3.0, 1e-2, 1e-4]])
    light = analyze_points(ServiceParams(*theta[1]), server, n, m, np.full(3, 1e-3))
    rates = 0.6 * np.asarray(light.saturation_rate_rps)
    sync = np.array([False, True, False])
    together = point_latencies(theta, server, n, m, rates, synchronous=sync)
    for p in range(2):
        for k in range(3):
            alone = point_latencies(
                theta[p : p + 1], server, n[k : k + 1], m[k : k + 1], rates[k : k + 1],
                synchronous=sync[k : k + 1],
            )  # fmt: skip
            assert [float(v[p, k]) for v in together] == [float(v[0, 0]) for v in alone]
            if not sync[k]:
                one = analyze(ServiceParams(*theta[p]), server, Workload(n[k], m[k]), rates[k])
                assert (one.ttft_ms, one.itl_ms) == (together[0][p, k], together[1][p, k])
