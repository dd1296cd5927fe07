"""The look-ahead's horizon is the startup delay the deployment's own pods show: from the cycle
that asked for more replicas than were ready to the first cycle that saw them ready."""

from __future__ import annotations

from dataclasses import replace

from exporter.collector.observations import DeploymentObservation
from exporter.config.values import ForecastMode
from exporter.sizing.cycle import Sizer
from exporter.sizing.forecast_choice import ForecastStrategy
from exporter.sizing.startup import MAX_STARTUP_S, STARTUP_SAMPLES, StartupClock
from tests.exporter.sizing.test_recommender import CAPACITY, LLAMA, deployment, observation


def test_a_step_up_is_timed_from_the_ask_to_the_ready_pods() -> None:
    clock = StartupClock()
    clock.asked(100.0, 2, 3)
    clock.ready(130.0, 2)
    clock.asked(130.0, 2, 4)  # a larger ask while the first runs: the first is timed
    assert clock.measured_s is None
    clock.ready(400.0, 3)
    assert clock.measured_s == 300.0


def test_a_larger_ask_while_pods_start_is_timed_from_its_own_cycle() -> None:
    # 6 asked at 0 s, 8 at 60 s; 6 ready at 300 s, 8 at 360 s: two steps of 300 s. Timed from
    # when the first finished (300 s), the second would read 60 s (a conversation replay's
    # horizon fell from 300 to 225 s so).
    clock = StartupClock()
    clock.asked(0.0, 5, 6)
    clock.asked(30.0, 5, 6)
    clock.asked(60.0, 5, 8)
    clock.ready(300.0, 6)
    clock.asked(300.0, 6, 8)
    clock.ready(360.0, 8)
    assert list(clock.samples) == [300.0, 300.0]


def test_an_ask_withdrawn_or_never_served_is_not_a_delay() -> None:
    clock = StartupClock()
    clock.asked(0.0, 2, 3)
    clock.asked(30.0, 2, 2)  # no more than ready: withdrawn
    clock.ready(300.0, 3)
    clock.asked(400.0, 3, 5)
    clock.ready(400.0 + MAX_STARTUP_S + 30.0, 4)  # a scaler that never gets there: dropped
    clock.ready(400.0 + MAX_STARTUP_S + 60.0, 5)
    assert clock.measured_s is None


def test_the_median_of_the_last_steps_resists_one_slow_node() -> None:
    clock = StartupClock()
    for i, delay in enumerate([90.0, 90.0, 1200.0, 120.0, 90.0, 90.0]):
        t = 10_000.0 * i
        clock.asked(t, 1, 2)
        clock.ready(t + delay, 2)
    assert len(clock.samples) == STARTUP_SAMPLES and clock.measured_s == 90.0


def test_the_measured_delay_replaces_the_configured_horizon_and_survives_a_restart() -> None:
    strategy = ForecastStrategy(ForecastMode.AUTO, 90.0)
    assert strategy.horizon_s == 90.0
    strategy.startup.asked(0.0, 1, 2)
    strategy.startup.ready(300.0, 2)
    assert strategy.horizon_s == 300.0
    restored = ForecastStrategy(ForecastMode.AUTO, 90.0)
    restored.restore(strategy.to_dict(), 400.0)
    assert restored.horizon_s == 300.0
    restored.restore({"startup": {"samples": [-1.0, "x", float("inf"), True]}}, 400.0)
    assert list(restored.startup.samples) == [300.0]
    # Without a look-ahead configured, none is started by a measurement.
    off = ForecastStrategy(ForecastMode.AUTO, 0.0)
    off.restore(strategy.to_dict(), 400.0)
    assert off.horizon_s == 0.0


def test_the_sizer_times_its_own_step_up_and_sizes_the_trend_that_far_ahead() -> None:
    # One replica well over its capacity (mean TTFT at its target: nothing holds the count):
    # the seeded model asks for more; they are seen ready 240 s later, and the look-ahead
    # (configured 90 s) then looks 240 s ahead.
    dep = deployment(look_ahead_s=90.0, scale_down_stabilization_s=0.0, initial_params=LLAMA)
    sizer = Sizer([dep])
    cycle = sizer.cycles["llama"]
    rate = 5 * CAPACITY

    def window(pods: int) -> DeploymentObservation:
        return replace(observation(rate, pods), ttft_ms=50.0)

    asked = sizer.decide({"llama": sizer.observe("llama", window(1), 0.0)})["llama"]
    wanted = asked.desired_replicas
    assert wanted is not None and wanted > 1
    for t in (30.0, 60.0, 90.0):
        sizer.decide({"llama": sizer.observe("llama", window(1), t)})
    assert cycle.forecaster.horizon_s == 90.0
    sizer.decide({"llama": sizer.observe("llama", window(wanted), 240.0)})
    assert cycle.forecaster.horizon_s == 240.0
    # The recommender's own trend (the default forecaster) is extended as far.
    assert cycle.recommender._look_ahead == 240.0
