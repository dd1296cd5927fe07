"""The closed-loop percentile scenario: scoring and the cost search."""

from __future__ import annotations

import math

import numpy as np

from bench.closed_loop import SCENARIOS, Arm, run_arm
from bench.lib.closed_loop_percentiles import (
    COST_TOLERANCE,
    MAX_SEARCH_RUNS,
    PERCENTILE_SCENARIOS,
    match_cost,
    replica_hours,
    score,
    trailing_percentiles,
)
from bench.lib.closed_loop_report import Cycle, Run


def _run(counts: list[int]) -> Run:
    run = Run("s", "a", 1)
    for k, n in enumerate(counts):
        run.cycles.append(Cycle(end_s=30.0 * (k + 1), offered_rps=1.0, arrival_rps=1.0,
                                provisioned=n, ready=n, desired=n, reason="", tuner_state="",
                                capacity_rps=None, ttft_ms=None, itl_ms=None,
                                kv_usage_ratio=0.0, peak_waiting=0, loading=False))
    return run


def test_replica_hours_counts_each_window() -> None:
    assert replica_hours(_run([1, 2, 3, 2])) == 8 * 30.0 / 3600.0


def test_cost_search_lands_within_tolerance() -> None:
    """Replicas fall in steps as the scale loosens the targets; the search stops within 3 %."""
    def run_at(scale: float) -> Run:
        return _run([max(1, math.ceil(4.0 / scale))] * 120)

    target = replica_hours(_run([7] * 60 + [8] * 60))  # 7.5 replicas: no scale gives it exactly
    _, scale, tried = match_cost(run_at, target, 0.2, 2.0)
    best = min(abs(t["replica_hours"] - target) / target for t in tried)
    assert len(tried) <= MAX_SEARCH_RUNS
    assert best <= 1.0 / 7.5 + 1e-9  # the closest step: 7 or 8 replicas
    got = replica_hours(run_at(scale))
    assert abs(got - target) / target == best
    exact = replica_hours(_run([5] * 120))
    _, scale, tried = match_cost(run_at, exact, 0.2, 2.0)
    assert abs(replica_hours(run_at(scale)) - exact) / exact <= COST_TOLERANCE


def test_trailing_percentiles_read_the_simulated_requests() -> None:
    """The last cycle's trailing p95 TTFT is the 95th percentile of the requests whose first
    token came out in the last 300 s, computed here independently."""
    run = run_arm(SCENARIOS[0], Arm.THROUGHPUT, 7, 360.0)
    found = trailing_percentiles(run)
    assert len(found) == len(run.cycles) == 12
    req = run.requests
    assert req is not None
    with np.errstate(invalid="ignore"):
        keep = (req.first_token_s > 60.0) & (req.first_token_s <= 360.0)
    ttft = np.sort(req.ttft_ms[keep])
    assert found[-1][0] == ttft[math.ceil(0.95 * ttft.size) - 1]
    p99 = found[-1][1]
    assert p99 is not None and 0.0 < p99 < 1000.0
    s = score(run, PERCENTILE_SCENARIOS[0])
    assert s["cycles"] == 12 and 0 <= s["any_over"] <= s["cycles_outside_loading"]


def test_target_rows_tell_met_missed_and_infeasible_claims_checked_at_max() -> None:
    from bench.lib.percentile_targets import target_rows, target_table

    ours, at_max = _run([1] * 20), _run([10] * 20)
    ours.cycles[0].loading = True  # not judged
    ours.infeasible = [()] * 10 + [("b",)] * 10  # b said infeasible in the second half
    names, targets = ("a", "b"), (100.0, 40.0)
    # a: missed in 1 of 19 judged windows; b: missed in the 10 windows it was said infeasible
    # in, and the simulator at max misses b in 20 of 20.
    mine = [(150.0 if k == 5 else 50.0, 60.0 if k >= 10 else 30.0) for k in range(20)]
    fixed = [(50.0, 45.0)] * 20
    rows = target_rows(ours, at_max, names, targets, (mine, fixed), 1)
    table = target_table(rows)
    assert rows[0]["judged_windows"] == 19
    assert table["a"]["missed_pct"] == 100.0 / 19 and table["a"]["verdict"] == "missed"
    assert table["b"]["said_infeasible_pct"] == 100.0 * 10 / 19
    assert table["b"]["at_max_missed_pct"] == 100.0
    assert table["b"]["verdict"] == "infeasible (checked)"
    # The same claim when the simulator at max meets the target fails.
    rows = target_rows(ours, at_max, names, targets, (mine, [(50.0, 30.0)] * 20), 1)
    assert target_table(rows)["b"]["verdict"] == "infeasible (claim fails at max)"
    # Met: at most 5 % of judged windows.
    calm = [(50.0, 30.0)] * 20
    assert target_table(target_rows(ours, at_max, names, targets, (calm, calm), 1))["a"][
        "verdict"
    ] == "met"


def test_series_missed_judges_only_the_replays_judged_windows_with_a_value() -> None:
    from bench.lib.percentile_targets import series_missed

    series = {"judged": [False, True, True, True], "itl_per_token_p99": [90.0, None, 30.0, 45.0]}
    assert series_missed(series, "itl_per_token_p99", 40.0) == [None, None, False, True]


def test_the_percentile_bench_replays_through_the_exposition_and_its_histograms() -> None:
    """Ours reads vLLM's latency histograms through the emulated exposition (the SLO window
    holds the per-token gaps), the fixed arm holds replicas.max, every arm is judged from the
    same window on."""
    from bench.percentile_targets import replay_seed
    from exporter.collector.vllm_metrics import HistogramName
    from exporter.replay.exposition import ExpositionObserver

    found = replay_seed(PERCENTILE_SCENARIOS[0], 7, 300.0, keep_arms=True)
    cards = found["cards"]
    assert set(cards) == {"ours", "fixed", "throughput"}
    assert all(isinstance(arm.observer, ExpositionObserver) for arm in found["arms"])
    ours = found["arms"][0].policy
    gaps = ours.cycle.slo_window.total(HistogramName.ITL_S)
    assert gaps is not None and gaps.count > 1000
    assert cards["fixed"].series["provisioned"][-1] == 10
    for card in cards.values():
        assert card.series["judged"] == [end > 120.0 for end in card.series["end_s"]]
    assert len(found["infeasible"]) == len(cards["ours"].series["end_s"]) == 10
