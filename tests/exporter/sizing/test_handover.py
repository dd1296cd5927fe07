"""The hand-over count: sized from the load with parameters the fleet's latencies cannot move,
independent of how many replicas serve, stabilized like the calibrated count."""

from __future__ import annotations

import math
from dataclasses import replace

from exporter.sizing.cycle import DeploymentCycle
from exporter.sizing.forecast_choice import held_for_rise
from exporter.sizing.handover import Handover, HandoverBasis, handover
from exporter.sizing.reasons import Reason
from exporter.sizing.recommender import Recommender
from model import PAPER_MODEL, ServiceParams, Tuner
from model.calibration.trust import TRUSTED_CONFIDENCE
from tests.exporter.sizing.test_recommender import CAPACITY, LLAMA, SHAPE, deployment, observation

PRIOR = Handover(LLAMA, HandoverBasis.PRIOR)
# A guess far from the data: what the tuner would publish from a few points of one load.
WRONG = ServiceParams(6.68, 0.2, 5.52e-4)


def test_the_seed_comes_first_then_the_prior() -> None:
    seed, prior = ServiceParams(5.0, 0.03, 6e-5), ServiceParams(5.0, 0.05, 5e-5)
    assert handover(None, prior) == Handover(prior, HandoverBasis.PRIOR)
    assert handover(seed, prior) == Handover(seed, HandoverBasis.SEED)


def test_the_hand_over_lasts_until_the_first_estimate_and_never_returns() -> None:
    dep = deployment(min_replicas=1)
    cycle = DeploymentCycle(dep)
    first = cycle.handover()
    assert first is not None and first.basis is HandoverBasis.PRIOR
    assert DeploymentCycle(deployment(initial_params=LLAMA)).handover() is None  # seeded
    cycle.tuner = Tuner.from_dict({**cycle.tuner.to_dict(), "params": LLAMA.to_dict(),
                                   "state": "fitted", "reason": "accepted"})  # fmt: skip
    assert cycle.handover() is None
    assert cycle.tuner.confidence() < TRUSTED_CONFIDENCE  # untrusted: still no hand-over


def test_the_count_does_not_depend_on_the_replicas_serving() -> None:
    rate = 2.5 * CAPACITY  # three replicas' worth
    counts = set()
    for pods in (1, 2, 3, 5, 6):
        rec = Recommender(deployment(scale_down_stabilization_s=0.0))
        # The mean TTFT at its target: no margin that would hold the count (next tests).
        obs = replace(observation(rate, pods), ttft_ms=50.0)
        decision = rec.decide(0.0, obs, WRONG, SHAPE, handover=PRIOR)
        assert decision.reason is Reason.HANDOVER
        counts.add(decision.desired_replicas)
    assert counts == {math.ceil(rate / CAPACITY)}


def test_the_hand_over_ignores_the_tuners_estimate_and_bias() -> None:
    rec = Recommender(deployment())
    obs = replace(observation(2.5 * CAPACITY, 1), ttft_ms=50.0)  # no margin to hold it
    decision = rec.decide(0.0, obs, WRONG, SHAPE, (0.4, 0.4), handover=PRIOR)
    assert decision.desired_replicas == 3
    assert decision.max_rate_per_replica_rps is not None
    assert math.isclose(decision.max_rate_per_replica_rps, CAPACITY, rel_tol=1e-6)


def test_scale_down_is_stabilized_like_the_calibrated_count() -> None:
    rec = Recommender(deployment())  # 300 s
    assert rec.decide(0.0, observation(2.5 * CAPACITY, 3), None, SHAPE,
                      handover=PRIOR).desired_replicas == 3  # fmt: skip
    held = rec.decide(30.0, observation(0.5 * CAPACITY, 3), None, SHAPE, handover=PRIOR)
    assert held.desired_replicas == 3 and held.reason is Reason.HANDOVER
    later = rec.decide(331.0, observation(0.5 * CAPACITY, 3), None, SHAPE, handover=PRIOR)
    assert later.desired_replicas == 1


def test_never_below_the_ready_count_while_the_queue_grows() -> None:
    rec = Recommender(deployment(scale_down_stabilization_s=0.0))
    obs = observation(0.5 * CAPACITY, 4, growing=True)
    decision = rec.decide(0.0, obs, None, SHAPE, handover=PRIOR)
    assert decision.desired_replicas == 5 and decision.reason is Reason.HANDOVER


def test_targets_out_of_the_priors_reach_hold_the_ready_count() -> None:
    # A prior that cannot meet the targets at any load must not send the fleet to replicas.max.
    slow = Handover(ServiceParams(200.0, 0.2, 5.52e-4), HandoverBasis.PRIOR)
    rec = Recommender(deployment(scale_down_stabilization_s=0.0))
    decision = rec.decide(0.0, observation(CAPACITY, 2), None, SHAPE, handover=slow)
    assert decision.desired_replicas == 2 and decision.reason is Reason.HANDOVER
    grows = rec.decide(30.0, observation(CAPACITY, 2, growing=True), None, SHAPE, handover=slow)
    assert grows.desired_replicas == 3


def test_a_fleet_serving_its_load_with_margin_is_not_stepped_up_on_the_prior() -> None:
    # One replica at 2.5x the prior's capacity, its mean TTFT 30 ms and ITL 12 ms against
    # targets of 50 and 25: the window says the load is within its capacity, the prior only
    # that it may not be (issue 36: one replica at 11 req/s, TTFT 46 ms, stepped up to 2).
    rec = Recommender(deployment(scale_down_stabilization_s=0.0))
    served = replace(observation(2.5 * CAPACITY, 1), ttft_ms=30.0, avg_running_per_pod=40.0)
    decision = rec.decide(0.0, served, None, SHAPE, handover=PRIOR)
    assert decision.desired_replicas == 1 and decision.reason is Reason.HANDOVER
    assert decision.model_replicas == 3  # the prior's own count, said beside it


def test_the_hold_still_steps_up_for_the_rise_the_look_ahead_expects() -> None:
    # The same fleet serving its load with margin, and a forecast that the rate doubles within
    # the look-ahead: today's count vouches for today's load only, so the fleet grows with the
    # rate at today's load per replica (2), not to the prior's count (6) nor held at 1 (issue
    # 46: on the diurnal day the hold kept a forecast's third replica back for 2 minutes).
    served = replace(observation(2.5 * CAPACITY, 1), ttft_ms=30.0, avg_running_per_pod=40.0)
    rec = Recommender(deployment(scale_down_stabilization_s=0.0))
    decision = rec.decide(0.0, served, None, SHAPE, handover=PRIOR, projected_rps=5 * CAPACITY)
    assert decision.desired_replicas == 2 and decision.reason is Reason.HANDOVER
    assert decision.model_replicas == 5
    # No rise forecast: held where it is.
    flat = Recommender(deployment(scale_down_stabilization_s=0.0))
    held = flat.decide(0.0, served, None, SHAPE, handover=PRIOR, projected_rps=2.5 * CAPACITY)
    assert held.desired_replicas == 1


def test_the_recommenders_own_trend_stays_held() -> None:
    # The default look-ahead (a slope over four windows, no forecaster's rate): held at 1.
    served = replace(observation(2.5 * CAPACITY, 1), ttft_ms=30.0, avg_running_per_pod=40.0)
    rec = Recommender(deployment(scale_down_stabilization_s=0.0, look_ahead_s=300.0))
    rising = [(t, 2.5 * CAPACITY * (1 + t / 300.0)) for t in (-90.0, -60.0, -30.0, 0.0)]
    decision = rec.decide(0.0, served, None, SHAPE, handover=PRIOR, trend=rising)
    assert rec.projected_rate(2.5 * CAPACITY) > 4 * CAPACITY  # it does look ahead
    assert decision.desired_replicas == 1


def test_held_for_rise_scales_todays_fleet_by_the_rise() -> None:
    assert held_for_rise(2, 18.6, 24.7) == 3  # the diurnal day's 1770 s
    assert held_for_rise(2, 20.0, 20.0) == 2 and held_for_rise(2, 20.0, 15.0) == 2
    assert held_for_rise(3, 10.0, 20.0) == 6
    assert held_for_rise(2, 0.0, 5.0) == 2  # no rate: nothing to scale
    assert held_for_rise(0, 5.0, 10.0) == 0


def test_without_margin_the_prior_still_steps_up() -> None:
    served = replace(observation(2.5 * CAPACITY, 1), ttft_ms=30.0, avg_running_per_pod=40.0)
    near = replace(served, ttft_ms=47.0)  # within, but not by 10 %
    waits = replace(served, avg_waiting_per_pod=2.0)  # requests wait for a batch slot
    filling = replace(served, avg_running_per_pod=200.0)  # of 256: a batch still filling
    joined = replace(served, new_pods=("p2",))
    for obs in (near, waits, filling, joined):
        rec = Recommender(deployment(scale_down_stabilization_s=0.0))
        assert rec.decide(0.0, obs, None, SHAPE, handover=PRIOR).desired_replicas == 3, obs


def test_misses_seen_by_the_headroom_factor_still_step_up() -> None:
    rec = Recommender(deployment(scale_down_stabilization_s=0.0))
    served = replace(observation(2.5 * CAPACITY, 1), ttft_ms=30.0, avg_running_per_pod=40.0)
    decision = rec.decide(0.0, served, None, SHAPE, handover=PRIOR, headroom=1.1)
    assert decision.desired_replicas is not None and decision.desired_replicas >= 3


def test_a_trusted_estimate_is_not_held_by_the_window() -> None:
    rec = Recommender(deployment(scale_down_stabilization_s=0.0))
    served = replace(observation(2.5 * CAPACITY, 1), ttft_ms=30.0, avg_running_per_pod=40.0)
    assert rec.decide(0.0, served, LLAMA, SHAPE, trusted=True).desired_replicas == 3


def test_bursty_arrivals_are_not_held_by_one_window() -> None:
    # The same window, but arrivals said to be bursty (inter-arrival CV 3): one window's means
    # do not vouch for the next, and the step up stands (the tuner gets a second operating
    # point: tests/exporter/daemon/test_calibration_gates.py).
    served = replace(observation(2.5 * CAPACITY, 1), ttft_ms=30.0, avg_running_per_pod=40.0)
    for cv, count in ((1.0, 1), (3.0, 3)):
        model = replace(PAPER_MODEL, arrival_cv=cv)
        rec = Recommender(deployment(scale_down_stabilization_s=0.0, model=model))
        assert rec.decide(0.0, served, None, SHAPE, handover=PRIOR).desired_replicas == count
