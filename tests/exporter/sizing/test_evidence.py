"""The evidence envelope (exporter/sizing/evidence.py): the published capacity stays within what
the same windows show, whatever the model's parameters."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from exporter.config.values import SloConfig
from exporter.sizing.evidence import (
    NOISE_MARGIN,
    PastMiss,
    capacity_extrapolated,
    envelope,
    miss_floor,
    missed,
    overshoot,
    past_misses,
    scale_down_floor,
    served,
    spread_beyond_noise,
    spread_over_history,
)
from exporter.sizing.recommender import Reason, Recommender
from exporter.sizing.what_if import what_if
from model import Observation, ServiceParams
from tests.exporter.sizing.test_recommender import SHAPE, deployment, observation

SLO = SloConfig(ttft_ms=50.0, itl_ms=25.0)


def point(rate_rps: float, ttft_ms: float, itl_ms: float, growing: bool = False) -> Observation:
    return Observation(
        rate_rps=rate_rps, avg_input_tokens=1024.0, avg_output_tokens=512.0, ttft_ms=ttft_ms,
        itl_ms=itl_ms, queue_growing=growing,
    )  # fmt: skip


def test_envelope_reads_served_missed_and_stable_rates() -> None:
    points = [
        point(4.0, 30.0, 15.0),  # served
        point(5.0, 44.0, 20.0),  # served (44 <= 45)
        point(6.0, 48.0, 20.0),  # within the noise of the TTFT target: neither
        point(7.0, 40.0, 28.0),  # ITL missed (28 >= 27.5)
        point(9.0, 70.0, 26.0),  # missed
        point(8.0, 500.0, 40.0, growing=True),  # missed, and not stable
    ]
    env = envelope(points, SLO)
    assert (env.served_rps, env.missed_rps, env.stable_rps) == (5.0, 7.0, 9.0)
    assert (env.low_rps, env.high_rps) == (4.0, 9.0)
    # The newest three did not all miss the TTFT target (the 7 req/s one missed ITL): no floor.
    assert env.overload_floor_rps is None
    assert env.capacity(1.0) == 5.0 and env.capacity(6.0) == 6.0 and env.capacity(12.0) == 7.0
    # They all did: the median of 7 / (1.4 x 1.1), 9 / (1.4 x 1.1), 8 / (10 x 1.1).
    over = [point(7.0, 70.0, 20.0), point(9.0, 70.0, 26.0), point(8.0, 500.0, 40.0, growing=True)]
    assert envelope(points[:3] + over, SLO).overload_floor_rps == pytest.approx(7.0 / 1.54)
    # ITL 1.5x over its target, TTFT well within: ITL supports no floor.
    itl_bound = [point(2.5, 30.0, 37.5)] * 3
    assert envelope(itl_bound, SLO).overload_floor_rps is None
    assert env.saturation(3.0) == 9.0 and env.saturation(20.0) == 20.0
    # Percentile targets only: the mean latencies say nothing either way.
    assert envelope(points, SloConfig()).served_rps is None
    assert overshoot(points[0], None, 25.0) == pytest.approx(0.6)
    assert served(1.0 - NOISE_MARGIN) and not served(0.95) and not missed(1.05)


def test_overload_bounds_the_step() -> None:
    # One replica 30 % over its TTFT target at 11 req/s: at least 11 / (1.3 x 1.1) req/s.
    points = [point(11.0, 65.0, 20.0)] * 3
    assert envelope(points, SLO).overload_floor_rps == pytest.approx(11.0 / 1.43)
    rec = Recommender(deployment(max_replicas=8))
    # A fit that put most of the TTFT into alpha: the same window, a capacity far below it.
    slow = ServiceParams(40.0, 2.01e-2, 5.52e-5)
    alone = Recommender(deployment(max_replicas=8)).decide(0.0, observation(11.0, 1), slow, SHAPE)
    assert alone.desired_replicas == 8  # what the model alone says
    decision = rec.decide(0.0, observation(11.0, 1), slow, SHAPE, evidence=points)
    assert decision.desired_replicas == 2 and decision.reason is Reason.EVIDENCE_BOUND
    assert decision.max_rate_per_replica_rps == pytest.approx(11.0 / 1.43)


def latency_ms(rate_rps: float, light_ms: float, saturation_rps: float) -> float:
    """A monotone latency curve: the light-load value over (1 - load)."""
    return light_ms / max(1.0 - rate_rps / saturation_rps, 0.02)


@pytest.mark.parametrize("seed", range(40))
def test_no_published_capacity_beyond_what_the_windows_show(seed: int) -> None:
    # Random single-shape windows (a monotone truth, 4 % noise: a served and a missed window
    # never cross) and a random model: the published capacity is not below a rate the same
    # windows served within target, nor above one they missed at.
    rng = np.random.default_rng(seed)
    saturation = rng.uniform(5.0, 20.0)
    light_ttft, light_itl = rng.uniform(15.0, 40.0), rng.uniform(8.0, 20.0)
    rates = np.sort(rng.uniform(0.2, 0.95, int(rng.integers(3, 11))) * saturation)
    rng.shuffle(rates)
    points = [
        point(
            float(r),
            latency_ms(r, light_ttft, saturation) * rng.uniform(0.96, 1.04),
            latency_ms(r, light_itl, saturation) * rng.uniform(0.96, 1.04),
        )
        for r in rates
    ]
    model = ServiceParams(
        rng.uniform(2.0, 40.0), rng.uniform(2e-3, 6e-2), rng.uniform(1e-5, 2e-4)
    )
    rec = Recommender(deployment(max_replicas=50))
    current = int(rng.integers(1, 4))
    arrival = float(rates[-1]) * current
    decision = rec.decide(0.0, observation(arrival, current), model, SHAPE, evidence=points)
    ratios = [overshoot(p, SLO.ttft_ms, SLO.itl_ms) for p in points]
    served_rates = [p.rate_rps for p, o in zip(points, ratios, strict=True) if served(o)]
    missed_rates = [p.rate_rps for p, o in zip(points, ratios, strict=True) if missed(o)]
    capacity = decision.max_rate_per_replica_rps
    assert capacity is not None
    assert capacity >= max(served_rates, default=0.0) - 1e-9
    assert capacity <= min(missed_rates, default=math.inf) + 1e-9
    assert decision.saturation_rate_per_replica_rps >= max(rates) - 1e-9
    # And the count is what that capacity needs at the sizing rate (no margin here).
    if decision.reason is Reason.EVIDENCE_BOUND:
        assert decision.desired_replicas == math.ceil(arrival / capacity - 1e-9)


def test_windows_that_agree_with_the_model_leave_it_alone() -> None:
    truth = ServiceParams(6.68, 2.01e-2, 5.52e-5)
    plain = Recommender(deployment()).decide(0.0, observation(20.0, 3), truth, SHAPE)
    # Served well below the model's capacity, missed well above it: nothing to move.
    points = [point(2.0, 30.0, 12.0), point(4.0, 40.0, 15.0), point(11.0, 90.0, 30.0)]
    checked = Recommender(deployment()).decide(
        0.0, observation(20.0, 3), truth, SHAPE, evidence=points
    )
    assert plain == replace(checked, capacity_extrapolation_ratio=None)
    assert plain.reason is not Reason.EVIDENCE_BOUND
    assert checked.capacity_extrapolation_ratio == 1.0  # within the windows' rates


def test_a_what_if_beyond_the_observed_rates_says_so_and_is_not_below_them() -> None:
    points = [point(4.0, 30.0, 14.0), point(5.0, 35.0, 15.0), point(6.0, 48.0, 17.0)]
    dep = deployment(max_replicas=8)
    truth = ServiceParams(6.68, 2.01e-2, 5.52e-5)
    inside = what_if(dep, truth, SHAPE, None, 10.0, 2, (), evidence=points)
    assert not inside.extrapolated and inside.extrapolation_ratio == 1.0
    body = inside.to_json()
    assert body["extrapolated"] is False
    assert body["observed_rate_per_replica_requests_per_second"] == {"low": 4.0, "high": 6.0}
    # One replica at 9 req/s: 1.5x the highest rate observed. A fit far too fast (alpha /
    # 10) would promise a TTFT below what 6 req/s already measured; the answer is not below it.
    fast = ServiceParams(0.668, 2.01e-3, 5.52e-6)
    beyond = what_if(dep, fast, SHAPE, None, 9.0, 1, (), evidence=points)
    assert beyond.extrapolated and beyond.extrapolation_ratio == pytest.approx(1.5)
    assert beyond.ttft_ms >= 48.0 * (1 - NOISE_MARGIN) and beyond.itl_ms >= 17.0 * 0.9
    assert beyond.to_json()["extrapolated"] is True
    below = what_if(dep, truth, SHAPE, None, 2.0, 1, (), evidence=points)
    assert below.extrapolated and below.extrapolation_ratio == pytest.approx(2.0)
    # Nothing observed: every answer is an extrapolation.
    blind = what_if(dep, truth, SHAPE, None, 2.0, 1, ())
    assert blind.extrapolated and blind.extrapolation_ratio is None
    assert blind.to_json()["observed_rate_per_replica_requests_per_second"] is None


def test_a_scale_down_goes_no_further_than_the_rates_served_support() -> None:
    # Served within the targets at 5.5 req/s per replica (2 replicas at 11 req/s): the model
    # may claim one replica carries 11, but no window has shown more than 5.5 x 1.5 served.
    env = envelope([point(5.5, 30.0, 15.0)], SLO)
    assert scale_down_floor(11.0, env) == 2
    assert scale_down_floor(8.0, env) == 1  # within 1.5 x what was served: the step is taken
    assert scale_down_floor(11.0, envelope([], SLO)) == 1  # nothing served: no floor
    # Past misses held over the window's slide still bound the count: 1 replica missed at 11.
    old_miss = point(11.0, 90.0, 20.0)
    window = [point(5.5, 30.0, 15.0)]
    kept = past_misses(window, [(old_miss, 1), (window[0], 2)], SLO)
    assert kept == (PastMiss(11.0, 1),)
    assert [miss_floor(rate, kept) for rate in (10.0, 11.0, 30.0)] == [1, 2, 2]


def test_a_miss_bounding_the_capacity_is_not_counted_again_by_the_headroom_factor() -> None:
    # A window missed at 2 req/s per replica (a burst, say): the capacity is moved to 2, and
    # 7 req/s needs 4 replicas at it. The same miss grew the headroom factor to 1.2; sizing
    # 1.2 x 7 at the capacity the miss set would count it twice (5 replicas).
    truth = ServiceParams(6.68, 2.01e-2, 5.52e-5)
    points = [point(2.0, 90.0, 15.0)]
    counts = [
        Recommender(deployment()).decide(
            0.0, observation(7.0, 4), truth, SHAPE, evidence=points, headroom=factor
        )
        for factor in (1.0, 1.2)
    ]
    assert [c.desired_replicas for c in counts] == [4, 4]
    assert all(c.reason is Reason.EVIDENCE_BOUND for c in counts)


def test_a_miss_out_of_the_window_bounds_the_count_not_the_capacity_per_replica() -> None:
    # Two replicas once missed at 2 req/s each (4 in all: a window of bursts, say), and the
    # tuner's window has slid past it. Kept as a per-replica bound for the hour, the miss sized
    # every later window at 2 req/s a replica: 5 replicas at 9 req/s (a conversation trace went
    # from 5 to 7-8 replicas that way). As a count, it asks for 3 at 4 req/s and above.
    truth = ServiceParams(6.68, 2.01e-2, 5.52e-5)
    window = [point(2.5, 30.0, 15.0)]
    misses = past_misses(window, [(point(2.0, 90.0, 15.0), 2), (window[0], 3)], SLO)
    counts = {}
    for rate in (3.0, 4.5, 9.0):
        rec = Recommender(deployment(scale_down_stabilization_s=0.0))
        decision = rec.decide(0.0, observation(rate, 3), truth, SHAPE, evidence=window,
                              misses=misses)  # fmt: skip
        counts[rate] = (decision.desired_replicas, decision.model_replicas)
    # Below the rate missed at, the model's count; from it on, not below 3.
    assert counts == {3.0: (1, 1), 4.5: (3, 1), 9.0: (3, 2)}


# The laptop recipe's windows (issue 35): 2 emulated replicas at 14 req/s, 5 s windows, each
# per-replica point about 7 req/s, served within TTFT 50 / ITL 25 ms, with a partial fit that
# put the latency into alpha and so claims 20 req/s (the simulator's truth: 9.1 req/s, the
# mean TTFT crossing 50 ms; `vllm-sizer simulate`, seeds 0 and 1).
LAPTOP = [
    point(r, t, 12.0)
    for r, t in ((6.1, 38.5), (6.9, 40.0), (7.2, 41.0), (6.5, 39.0), (6.8, 40.5), (7.0, 40.0))
]
HEAVY = ServiceParams(9.717, 9.437e-3, 1.497e-5)


def test_one_operating_point_claims_what_it_served_not_the_fits_extrapolation() -> None:
    dep = deployment(max_replicas=8)
    # Growth with load unidentified: the claim is the highest rate served, and as saturation
    # the highest rate served stably; within 0.5-1.0x the truth's 9.1 req/s.
    env = envelope(LAPTOP, SLO)
    assert env.claim(20.0, 26.0, slope_known=False) == (7.2, 7.2)
    assert env.claim(20.0, 26.0, slope_known=True) == (20.0, 26.0)
    # A figure within the windows' rates (and their noise) is one they test: the model's.
    assert env.claim(7.8, 26.0, slope_known=False) == (7.8, 7.8)
    # Loads spread (a ramp): the fit's growth is what the data identified.
    ramp = [point(2.0 + k, 30.0 + k, 9.0 + k) for k in range(6)]
    assert envelope(ramp, SLO).claim(20.0, 26.0, slope_known=False) == (20.0, 26.0)
    # The count is not sized on the claim (the same either way); the gauges publish it, and
    # how far the model's capacity lies from the windows' rates (issue 35: on main the gauge
    # published the fit's 2.8x).
    obs = observation(14.0, 2)
    known = Recommender(dep).decide(0.0, obs, HEAVY, SHAPE, evidence=LAPTOP, slope_known=True)
    unknown = Recommender(dep).decide(0.0, obs, HEAVY, SHAPE, evidence=LAPTOP, slope_known=False)
    assert known.desired_replicas == unknown.desired_replicas
    assert known.sizing_capacity_rps == unknown.sizing_capacity_rps
    assert known.max_rate_per_replica_rps == known.sizing_capacity_rps
    assert (unknown.max_rate_per_replica_rps, unknown.saturation_rate_per_replica_rps) == (7.2, 7.2)
    ratio = unknown.capacity_extrapolation_ratio
    assert ratio is not None and ratio > 2.5 and capacity_extrapolated(ratio)
    assert known.capacity_extrapolation_ratio == ratio
    # The what-if claims the same: one rule (Envelope.claim) for both.
    far = what_if(dep, HEAVY, SHAPE, None, 14.0, 2, (), evidence=LAPTOP, slope_known=False)
    assert far.max_rate_per_replica_rps == unknown.max_rate_per_replica_rps
    assert far.saturation_rate_per_replica_rps == unknown.saturation_rate_per_replica_rps


def test_a_what_if_past_what_one_operating_point_served_answers_no_latency() -> None:
    dep = deployment(max_replicas=8)
    # The recipe's own question: 14 req/s on one replica. The fit says stable at about 50 ms;
    # the simulator says 17.6 s. The windows cannot tell: no stability, no latencies.
    far = what_if(dep, HEAVY, SHAPE, None, 14.0, 1, (), evidence=LAPTOP, slope_known=False)
    assert far.stable is None and far.extrapolated
    assert math.isinf(far.ttft_ms) and math.isinf(far.itl_ms)
    body = far.to_json()
    assert body["stable"] is None and body["ttft_seconds"] is None
    assert body["max_rate_per_replica_requests_per_second"] == 7.2
    assert body["replicas_needed"] == 2  # 14 / 7.2 (the fit's 14 / 20 would be 1)
    # Within the windows' own noise of what they served: the model answers.
    near = what_if(dep, HEAVY, SHAPE, None, 7.5, 1, (), evidence=LAPTOP, slope_known=False)
    assert near.stable is True and math.isfinite(near.ttft_ms)
    # With the growth known, the model answers at 14 too.
    known = what_if(dep, HEAVY, SHAPE, None, 14.0, 1, (), evidence=LAPTOP, slope_known=True)
    assert known.stable is True and known.max_rate_per_replica_rps > 2.5 * 7.2
    assert known.replicas_needed == 1


def test_a_spread_beyond_the_counting_noise_identifies_growth() -> None:
    rng = np.random.default_rng(0)
    # One load, 5 s windows: 35 requests a window (one replica at 7 req/s) spread the rates'
    # 20th-80th percentiles to about 1.33, past SPREAD_RATIO (1.3) alone; not past the noise.
    hits = 0
    for _ in range(200):
        rates = rng.poisson(35.0, 10) / 5.0
        hits += spread_beyond_noise(rates, 5.0, 1)
    assert hits <= 4  # at most 2 %
    # A load wandering over 0.3-0.7 of saturation, 30 s windows: spread.
    wander = np.linspace(3.7, 8.7, 10)
    assert spread_beyond_noise(wander, 30.0, 1)
    assert not spread_beyond_noise(wander[:4], 30.0, 1)  # too few points to say


def test_a_slow_wander_over_the_hour_identifies_growth_and_one_load_does_not() -> None:
    rng = np.random.default_rng(1)
    # One constant load, 30 s windows of 45 requests (one replica at 1.5 req/s, 128/2048
    # tokens), an hour of them: Poisson noise alone, never spread.
    for _ in range(20):
        counts = rng.poisson(45.0, 120)
        history = [(point(c / 30.0, 30.0, 9.0), 1) for c in counts]
        assert not any(spread_over_history(history[:k], 30.0) for k in range(60, 121, 10))
    # The same load wandering slowly between 0.35 and 0.6 of saturation (1.5-2.6 req/s, a new
    # level each 20 windows): ten points sit at one load, the hour spreads.
    levels = np.repeat([1.5, 2.6, 1.8, 2.3, 1.6, 2.5], 20)
    counts = rng.poisson(levels * 30.0)
    history = [(point(c / 30.0, 30.0, 9.0), 1) for c in counts]
    assert not spread_beyond_noise(counts[:10] / 30.0, 30.0, 1)
    assert spread_over_history(history, 30.0)
    assert not spread_over_history(history[:59], 30.0)  # too few points to say
    # Per-replica rates: one replica at 11 req/s, then two at 5.5 each (the same total).
    split = [(point(11.0, 40.0, 20.0), 1)] * 30 + [(point(5.5, 40.0, 12.0), 2)] * 30
    assert spread_over_history(split, 5.0)
