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
from model.queueing.chain import kernel_inputs
from model.queueing.kernel import mean as kernel_mean
from model.queueing.kernel import table as kernel_table
from model.queueing.params import ServerConfig, ServiceParams, Workload
from model.queueing.variant import DEFAULT_MODEL
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


def test_a_lazy_row_gives_the_outputs_of_a_whole_one() -> None:
    # One-shot calls fill their row without the logs and add those the solve reads
    # (kernel/table.py); a shared table is filled whole. Every output agrees bit for bit, at
    # B = 4096 too, over light to past-saturation rates, with and without a waiting room
    # (the finite chain reads every state's log), and points of one shape in one call (the
    # row is reused, its logs extended) agree with the same points one at a time.
    for queue in (None, 50):
        server = ServerConfig(
            max_batch_size=4096, max_num_batched_tokens=8192, max_queue_size=queue
        )
        params, load = ServiceParams(6.68, 2.01e-2, 5.52e-5), Workload(1024.0, 512.0)
        saturation = analyze(params, server, load, 1e-3).saturation_rate_rps
        rates = saturation * np.array([1e-4, 0.05, 0.3, 0.6, 0.9, 0.99, 0.9999, 1.2])
        curve = analyze(params, server, load, rates)
        ones = [analyze(params, server, load, float(r)) for r in rates]
        many = analyze_points(params, server, np.full(8, 1024.0), np.full(8, 512.0), rates[::-1])
        for name in FIELDS:
            if name == "offered_rate_rps":
                continue
            want = [float(v) for v in np.asarray(getattr(curve, name))]
            assert [float(getattr(one, name)) for one in ones] == want, name
            assert [float(v) for v in np.asarray(getattr(many, name))[::-1]] == want, name


def test_a_lazy_row_extended_to_every_state_is_the_whole_row() -> None:
    big_b = 1024
    server = ServerConfig(max_batch_size=big_b)
    work, opts, log_occ = kernel_inputs(server, DEFAULT_MODEL)
    shape = (1, kernel_table.STATE_FIELDS, big_b + 1)
    whole, lazy = np.zeros(shape), np.zeros(shape)
    rows_whole, rows_lazy = (np.zeros((1, kernel_table.ROW_FIELDS)) for _ in range(2))
    args = (0, 2000.0, 300.0, 6.68, 2.01e-2, 5.52e-5, opts[kernel_mean.OPT_BUDGET], work, log_occ)
    kernel_table.fill_row(whole, rows_whole, *args, False)
    kernel_table.fill_row(lazy, rows_lazy, *args, True)
    assert rows_lazy[0, kernel_table.LOGGED] == 0.0
    kernel_table.ensure_logs(lazy, rows_lazy, 0, 100)
    kernel_table.ensure_logs(lazy, rows_lazy, 0, big_b)
    # All but 1 / mu_i, which the solve computes where it needs it in a lazy row.
    fields = [f for f in range(kernel_table.STATE_FIELDS) if f != kernel_table.INV_MU]
    values = [f for f in range(kernel_table.ROW_FIELDS) if f != kernel_table.WHOLE]
    assert np.array_equal(whole[:, fields], lazy[:, fields])
    assert np.array_equal(rows_whole[:, values], rows_lazy[:, values])
    # p_B's sum of logs from running products is that of the logs to 1e-12 at B = 4096 and
    # 1e-13 here (its use: kernel/chain.py unit_weights).
    exact = whole[0, kernel_table.CUM_LOG_MU, big_b]
    assert rows_whole[0, kernel_table.CUM_LOG_MU_B] == pytest.approx(exact, rel=1e-13, abs=1e-13)
