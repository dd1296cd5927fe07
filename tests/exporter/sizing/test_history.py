"""One rate history per deployment, read for steadiness and tuner points (per pod) and for the
look-ahead's trend (total); one shape smoother, whose workload spans its last SHAPE_WINDOWS."""

from __future__ import annotations

from dataclasses import replace

import pytest

from exporter.collector.observations import ObservationStatus
from exporter.sizing.cycle import DeploymentCycle
from exporter.sizing.history import RateHistory
from exporter.sizing.traffic import SHAPE_WINDOWS, TrafficTracker
from tests.exporter.sizing.test_recommender import LLAMA, deployment, observation


def test_one_history_gives_the_per_pod_rates_and_the_trend() -> None:
    history = RateHistory()
    history.add(observation(4.0, 2), 30.0)
    history.add(observation(0.0, 0, status=ObservationStatus.WARMING_UP), 60.0)
    history.add(observation(9.0, 3), 90.0)
    assert history.per_pod() == (pytest.approx((2.0, 30.0)), pytest.approx((3.0, 30.0)))
    # A window whose rate was not read is no point of the trend.
    assert history.trend() == ((30.0, 4.0), (90.0, 9.0))


def test_the_look_ahead_reads_the_cycles_history() -> None:
    cycle = DeploymentCycle(deployment(look_ahead_s=90.0, initial_params=LLAMA))
    for k, rate in enumerate((10.0, 20.0, 30.0, 40.0)):
        estimate = cycle.observe(observation(rate, 4), 30.0 * (k + 1))
        decision = cycle.decide(estimate)
    assert estimate.trend[-4:] == ((30.0, 10.0), (60.0, 20.0), (90.0, 30.0), (120.0, 40.0))
    # 10 req/s more every 30 s: 90 s ahead, 30 req/s more.
    assert decision.sizing_rate_rps == pytest.approx(70.0)


def test_the_workload_is_the_mean_of_the_last_shapes_kept() -> None:
    tracker = TrafficTracker()
    for k in range(SHAPE_WINDOWS + 2):
        tracker.update(replace(observation(1.0, 1), avg_input_tokens=100.0 * (k + 1)))
    assert tracker.workload is not None
    last = [100.0 * (k + 1) for k in range(2, SHAPE_WINDOWS + 2)]  # equal weights
    assert tracker.workload.avg_input_tokens == pytest.approx(sum(last) / len(last))
    tracker.update(replace(observation(1.0, 1), avg_input_tokens=-1.0))
    assert tracker.unusable_shape is not None  # dropped, the workload kept
    assert tracker.workload.avg_input_tokens == pytest.approx(sum(last) / len(last))
