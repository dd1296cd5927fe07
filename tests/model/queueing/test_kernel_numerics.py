"""The compiled kernel against the numpy model it replaced: every `analyze` output of the
recorded cases (tests/data/analyze-baseline.json, see analyze_cases.py) within 1e-9 relative,
flags, chunk counts and infinities exactly."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

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
