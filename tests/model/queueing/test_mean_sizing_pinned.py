"""Sizing on mean targets only returns bit-identical results to those recorded before
percentile targets existed (tests/data/mean-sizing-baseline.json; see mean_sizing_cases.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.model.queueing.mean_sizing_cases import BASELINE_PATH, VARIANTS, run_case

RECORDED = json.loads(BASELINE_PATH.read_text())["cases"]


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=f"{c['id']}-{c['variant']}") for c in RECORDED]
)
def test_mean_only_sizing_is_bit_identical_to_the_recording(case: dict[str, Any]) -> None:
    assert run_case(case["input"], VARIANTS[case["variant"]]) == case["result"]


def test_the_recording_covers_golden_and_bench_cases_in_every_variant() -> None:
    ids = {c["id"] for c in RECORDED}
    assert {"S02_llama_ttftbound_slo_Q100", "R01_llama_ttftbound_replicas", "soak"} <= ids
    assert {c["variant"] for c in RECORDED} == set(VARIANTS)
