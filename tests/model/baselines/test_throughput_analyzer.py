"""Decode-throughput analyzer (paper §IX, Table II) with hand-computed expectations.

The running example: n = 900, m = 200 gives K_req = 900 + 100 = 1000 tokens; K_max = 100 000
gives N_sat = 0.85 * 100 000 / 1000 = 85 requests; the line ITL(u) = 10 u + 8.5 ms gives
ITL(0.85) = 17 ms, so C_rep = 85 / 0.017 s = 5000 tokens/s per replica.
"""

from __future__ import annotations

import pytest

from model.baselines.throughput_analyzer import (
    FitTier,
    FleetState,
    ItlLine,
    ThroughputAnalyzer,
    ThroughputAnalyzerConfig,
    ThroughputStatus,
    decode_throughput_replicas,
    kv_tokens_per_request,
)
from model.queueing.params import Workload

SHAPE = Workload(900, 200)
LINE = ItlLine(10.0, 8.5)


def fleet(q: int = 1, r: int = 1, waiting: float = 0.0, u: float = 0.5, itl: float = 13.5,
          generated: float = 0.0) -> FleetState:
    return FleetState(kv_utilization=u, itl_ms=itl, waiting_requests=waiting,
                      generated_tokens_rps=generated, ready_replicas=r, current_replicas=q,
                      kv_capacity_tokens=100_000)


def test_table_ii_defaults():
    cfg = ThroughputAnalyzerConfig()
    assert (cfg.baseline_itl_ms, cfg.min_samples, cfg.max_samples) == (6.0, 10, 20)
    assert (cfg.min_utilization_spread, cfg.max_sample_age_s) == (0.30, 1800.0)
    assert (cfg.min_fit_utilization, cfg.max_fit_utilization) == (0.15, 0.85)
    assert (cfg.shape_change_tolerance, cfg.rate_mismatch_tolerance) == (0.20, 0.15)
    assert (cfg.mismatch_cycles, cfg.min_verification_utilization) == (3, 0.30)
    assert (cfg.saturation_utilization, cfg.queue_drain_factor, cfg.prefix_hit_rate) == (
        0.85, 2.0, 0.0)
    assert (cfg.scale_up_threshold, cfg.scale_down_boundary) == (0.85, 0.70)


def test_kv_tokens_per_request():
    assert kv_tokens_per_request(SHAPE, 0.0) == 1000.0
    assert kv_tokens_per_request(SHAPE, 0.5) == 550.0  # 450 + 100


def test_supply_and_scale_up():
    # D = 30 * 200 = 6000 > 0.85 * 1 * 5000 = 4250 -> ceil(6000 / 4250) = 2.
    plan = decode_throughput_replicas(30.0, SHAPE, fleet(), LINE)
    assert plan.replica_supply_tokens_per_s == pytest.approx(5000.0)
    assert plan.itl_at_saturation_ms == pytest.approx(17.0)
    assert plan.demand_tokens_per_s == pytest.approx(6000.0)
    assert (plan.replicas, plan.status) == (2, ThroughputStatus.SCALE_UP)


def test_queue_adds_drain_demand():
    # Q_w / (phi ITL(u_sat)) = 187 / (2 * 0.017) = 5500; D = 11500 -> ceil(11500 / 4250) = 3.
    plan = decode_throughput_replicas(30.0, SHAPE, fleet(waiting=187), LINE)
    assert plan.demand_tokens_per_s == pytest.approx(11_500.0)
    assert plan.replicas == 3


def test_scale_down_to_what_the_demand_needs():
    # q = r = 4: D = 2000 < 0.7 * 4 * 5000 = 14000 -> 4 - 4 + ceil(2000 / 3500) = 1.
    plan = decode_throughput_replicas(10.0, SHAPE, fleet(q=4, r=4), LINE)
    assert (plan.replicas, plan.status) == (1, ThroughputStatus.SCALE_DOWN)


def test_scale_down_keeps_pending_replicas():
    # q = 3, r = 2 (one starting): 3 - 2 + ceil(2000 / 3500) = 2.
    plan = decode_throughput_replicas(10.0, SHAPE, fleet(q=3, r=2), LINE)
    assert plan.replicas == 2


def test_hold_inside_the_band():
    # q = r = 2: 7000 <= D = 8000 <= 8500 -> keep 2.
    plan = decode_throughput_replicas(40.0, SHAPE, fleet(q=2, r=2), LINE)
    assert (plan.replicas, plan.status) == (2, ThroughputStatus.HOLD)


def test_no_load_keeps_one_replica():
    plan = decode_throughput_replicas(0.0, SHAPE, fleet(q=3, r=3), LINE)
    assert plan.replicas == 1


def test_a_line_without_positive_itl_holds():
    plan = decode_throughput_replicas(10.0, SHAPE, fleet(q=2, r=2), ItlLine(-20.0, 6.0))
    assert (plan.replicas, plan.status, plan.fit) == (2, ThroughputStatus.NO_FIT, FitTier.NONE)


def test_first_cycle_uses_the_constrained_fit_with_the_baseline_intercept():
    # Slope = (16 - 6) / 0.5 = 20; ITL(0.85) = 23 ms; C_rep = 85 / 0.023 = 3695.65 tokens/s.
    analyzer = ThroughputAnalyzer()
    plan = analyzer.recommend(10.0, SHAPE, fleet(u=0.5, itl=16.0), timestamp_s=0.0)
    assert plan.fit is FitTier.CONSTRAINED
    assert plan.line == ItlLine(20.0, 6.0)
    assert plan.replica_supply_tokens_per_s == pytest.approx(85 / 0.023)
    # D = 2000 < 0.7 * 3695.65 = 2587 -> 1 - 1 + ceil(2000 / 2587) = 1.
    assert (plan.replicas, plan.status) == (1, ThroughputStatus.HOLD)


def test_unconstrained_fit_after_enough_spread_samples():
    analyzer = ThroughputAnalyzer()
    for k in range(10):
        u = 0.2 + 0.05 * k  # 0.20 .. 0.65: spread 0.45 >= 0.30
        plan = analyzer.recommend(30.0, SHAPE, fleet(u=u, itl=LINE.at(u)), timestamp_s=30.0 * k)
    assert plan.fit is FitTier.UNCONSTRAINED
    assert plan.line.slope_ms == pytest.approx(10.0)
    assert plan.line.intercept_ms == pytest.approx(8.5)
    assert analyzer.held_intercept_ms == pytest.approx(8.5)
    assert plan.replicas == 2  # as test_supply_and_scale_up


def test_narrow_spread_stays_constrained():
    analyzer = ThroughputAnalyzer()
    for k in range(12):
        u = 0.4 + 0.02 * k  # spread 0.22 < 0.30
        plan = analyzer.recommend(10.0, SHAPE, fleet(u=u, itl=LINE.at(u)), timestamp_s=30.0 * k)
    assert plan.fit is FitTier.CONSTRAINED
    assert plan.window_size == 12
    assert plan.line.intercept_ms == 6.0


def test_window_keeps_band_newest_and_young_samples():
    analyzer = ThroughputAnalyzer()
    analyzer.recommend(10.0, SHAPE, fleet(u=0.10), timestamp_s=0.0)  # below u_lo: not kept
    analyzer.recommend(10.0, SHAPE, fleet(u=0.90), timestamp_s=1.0)  # above u_hi: not kept
    assert analyzer.window_size == 0
    for k in range(25):
        analyzer.recommend(10.0, SHAPE, fleet(u=0.5), timestamp_s=2.0 + k)
    assert analyzer.window_size == 20  # N_max
    analyzer.recommend(10.0, SHAPE, fleet(u=0.5), timestamp_s=26.0 + 1800.5)
    assert analyzer.window_size == 1  # everything else older than 30 min


def test_shape_change_clears_the_window_but_keeps_the_intercept():
    analyzer = ThroughputAnalyzer()
    for k in range(10):
        u = 0.2 + 0.05 * k
        analyzer.recommend(10.0, SHAPE, fleet(u=u, itl=LINE.at(u)), timestamp_s=float(k))
    assert analyzer.held_intercept_ms == pytest.approx(8.5)
    analyzer.recommend(10.0, Workload(900, 230), fleet(u=0.5), timestamp_s=10.0)  # m +15 %
    assert analyzer.window_size == 11
    plan = analyzer.recommend(10.0, Workload(1200, 230), fleet(u=0.5), timestamp_s=11.0)  # +33 %
    assert analyzer.window_size == 1
    assert plan.fit is FitTier.CONSTRAINED and plan.line.intercept_ms == pytest.approx(8.5)


def test_decode_rate_mismatch_clears_the_window_after_three_cycles():
    # At u = 0.5 with one ready replica: 50 running requests; the constrained line passes
    # through ITL = 13.5 ms, so the line predicts 50 / 0.0135 = 3703.7 tokens/s.
    analyzer = ThroughputAnalyzer()
    agree = fleet(u=0.5, itl=13.5, generated=3700.0)
    off = fleet(u=0.5, itl=13.5, generated=2000.0)  # 85 % above the observed rate
    analyzer.recommend(10.0, SHAPE, agree, timestamp_s=0.0)
    analyzer.recommend(10.0, SHAPE, off, timestamp_s=1.0)
    analyzer.recommend(10.0, SHAPE, off, timestamp_s=2.0)
    assert analyzer.window_size == 3
    analyzer.recommend(10.0, SHAPE, off, timestamp_s=3.0)
    assert analyzer.window_size == 0
    analyzer.recommend(10.0, SHAPE, agree, timestamp_s=4.0)
    assert analyzer.window_size == 1


def test_idle_fleet_without_itl_has_no_fit():
    analyzer = ThroughputAnalyzer()
    plan = analyzer.recommend(0.0, SHAPE, fleet(q=2, r=2, u=0.0, itl=0.0), timestamp_s=0.0)
    assert (plan.replicas, plan.status, plan.fit) == (2, ThroughputStatus.NO_FIT, FitTier.NONE)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"baseline_itl_ms": 0.0}, "baseline_itl_ms"),
        ({"min_samples": 1}, "min_samples"),
        ({"max_samples": 5}, "max_samples"),
        ({"max_fit_utilization": 0.1}, "max_fit_utilization"),
        ({"prefix_hit_rate": 1.0}, "prefix_hit_rate"),
    ],
)
def test_config_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=f"`{field}`"):
        ThroughputAnalyzerConfig(**kwargs)


def test_inputs_are_checked():
    with pytest.raises(ValueError, match="`kv_utilization`"):
        fleet(u=-0.1)
    with pytest.raises(ValueError, match="`kv_capacity_tokens`"):
        FleetState(kv_utilization=0.5, itl_ms=10, waiting_requests=0, generated_tokens_rps=0,
                   ready_replicas=1, current_replicas=1, kv_capacity_tokens=0)
    with pytest.raises(ValueError, match="`total_rate_rps`"):
        decode_throughput_replicas(-1.0, SHAPE, fleet(), LINE)
