"""Past misses (issue 38): a miss a count as small served past at a rate as high bounds nothing,
and misses are compared with the rate less the slope its windows' noise explains."""

from __future__ import annotations

import pytest

from exporter.config.values import SloConfig
from exporter.sizing.evidence import miss_floor, past_misses
from exporter.sizing.forecasters import Series, linear_trend, rising_slope
from exporter.sizing.recommender import Recommender
from model import Observation, ServiceParams
from tests.exporter.sizing.test_recommender import SHAPE, deployment, observation

SLO = SloConfig(ttft_ms=50.0, itl_ms=25.0)
TRUTH = ServiceParams(6.68, 2.01e-2, 5.52e-5)


def point(rate_rps: float, ttft_ms: float) -> Observation:
    return Observation(rate_rps=rate_rps, ttft_ms=ttft_ms, itl_ms=15.0, avg_input_tokens=1024,
                       avg_output_tokens=512)  # fmt: skip


def test_a_miss_a_count_as_small_served_at_a_rate_as_high_bounds_nothing() -> None:
    # 4 replicas missed at 3.5 req/s each (14 in all) in a window of bursts; before and after
    # it the same 4 served 3.6 each within the targets. The load does not explain that miss.
    missed, served = point(3.5, 90.0), point(3.6, 30.0)
    window = [point(3.0, 30.0)]
    contradicted = past_misses(window, [(served, 4), (missed, 4), (window[0], 4)], SLO)
    assert contradicted == ()
    # Served by more replicas, or at a lower rate, it says nothing against the miss.
    for other, pods in ((point(3.6, 30.0), 5), (point(3.0, 30.0), 4)):
        kept = past_misses(window, [(missed, 4), (other, pods), (window[0], 4)], SLO)
        assert [(m.rate_rps, m.pods) for m in kept] == [(pytest.approx(14.0), 4)]
        assert miss_floor(15.0, kept) == 5


def test_a_rising_slope_loses_what_its_windows_noise_explains() -> None:
    times = [30.0 * k for k in range(10)]
    ramp = [(t, 5.0 + 0.5 * k) for k, t in enumerate(times)]  # equal steps: no noise
    assert rising_slope(ramp, 2.0) == pytest.approx(0.5 / 30.0)
    # One step of the load leaves the noise at the steps' median: the slope stands.
    step = [(t, 5.0 if k < 8 else 15.0) for k, t in enumerate(times)]
    assert rising_slope(step, 2.0) == pytest.approx(rising_slope(step))
    assert rising_slope(step) > 0.05
    # Window rates of a bursty stream (9 req/s mean, 1-17 a window): its last rise is noise.
    bursty = list(zip(times, [9.3, 5.3, 8.4, 10.4, 14.2, 9.7, 8.6, 7.2, 5.3, 14.9], strict=True))
    assert rising_slope(bursty) * 90.0 > 5.0
    assert rising_slope(bursty, 2.0) == 0.0
    # Without sigmas, the slope is the linear trend's own (the look-ahead is unchanged).
    series = Series(recent=bursty)
    assert linear_trend(series, 90.0) == pytest.approx(14.9 + rising_slope(bursty) * 90.0)


def test_a_past_miss_is_compared_with_the_rate_not_with_a_noisy_slope() -> None:
    # 4 replicas missed at 14 req/s, out of the tuner's window now. A window of 12.6 req/s
    # after noisy ones: the look-ahead projects past 14, the rate itself is under it.
    dep = deployment(look_ahead_s=90.0, max_replicas=12, scale_down_stabilization_s=0.0)
    misses = past_misses([point(3.0, 30.0)], [(point(3.5, 90.0), 4)], SLO)
    rates = [9.3, 5.3, 8.4, 10.4, 14.2, 9.7, 8.6, 7.2, 5.3, 12.6]
    trend = [(30.0 * k, r) for k, r in enumerate(rates)]
    decision = Recommender(dep).decide(270.0, observation(12.6, 4), TRUTH, SHAPE,
                                       misses=misses, trend=trend)  # fmt: skip
    assert decision.sizing_rate_rps is not None and decision.sizing_rate_rps > 14.0
    unbound = Recommender(dep).decide(270.0, observation(12.6, 4), TRUTH, SHAPE, trend=trend)
    assert decision.desired_replicas == unbound.desired_replicas < 5
    # At the rate it missed at, the count is the one more the miss asks for.
    at_miss = Recommender(dep).decide(270.0, observation(14.0, 4), TRUTH, SHAPE,
                                      misses=misses, trend=trend[:-1] + [(270.0, 14.0)])
    assert at_miss.desired_replicas == 5
