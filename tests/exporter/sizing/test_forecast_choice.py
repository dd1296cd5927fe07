"""The choice of forecaster by backtest at the horizon: it takes a forecaster that beats the
last value, and falls back to the last value when the pattern changes and it no longer does."""

from __future__ import annotations

import numpy as np

from exporter.config.values import ForecastMode
from exporter.sizing.forecast_choice import MIN_SCORED, ForecastStrategy
from exporter.sizing.forecasters import ForecasterName


def _run(strategy: ForecastStrategy, rates: list[float], start_s: float) -> list[ForecasterName]:
    chosen = []
    for i, rate in enumerate(rates):
        chosen.append(strategy.observe(start_s + 30.0 * i, rate).forecaster)
    return chosen


def test_the_backtest_switches_to_last_value_when_the_pattern_changes() -> None:
    rng = np.random.default_rng(3)
    strategy = ForecastStrategy(ForecastMode.AUTO, 90.0)
    ramp = [5.0 + 0.5 * i + rng.normal(0, 0.2) for i in range(150)]
    during_ramp = _run(strategy, ramp, 30.0)
    assert during_ramp[:MIN_SCORED] == [ForecasterName.LAST_VALUE] * MIN_SCORED  # unscored
    assert during_ramp[-1] is not ForecasterName.LAST_VALUE  # a trend beats the last value
    ramp_pick = during_ramp[-1]
    assert strategy.mae(ramp_pick) < strategy.mae(ForecasterName.LAST_VALUE)  # type: ignore[operator]
    # The load stops rising and moves in steps: after each, a trend overshoots for a while,
    # and the last value is right again one horizon on.
    steps = [level for level in (80.0, 60.0, 90.0, 70.0) for _ in range(40)]
    after = _run(strategy, steps, 30.0 * 151)
    assert after[-1] is ForecasterName.LAST_VALUE
    assert after[-30:] == [ForecasterName.LAST_VALUE] * 30  # and it stays there
    switches = sum(
        a is not b for a, b in zip(during_ramp + after, (during_ramp + after)[1:], strict=False)
    )
    assert switches <= 4  # no back and forth


def test_a_fixed_choice_sizes_with_its_forecaster_whatever_its_error() -> None:
    strategy = ForecastStrategy(ForecastMode.LINEAR_TREND, 90.0)
    rates = [10.0 + 1.0 * i for i in range(30)]
    outlooks = [strategy.observe(30.0 * (i + 1), r) for i, r in enumerate(rates)]
    assert {o.forecaster for o in outlooks} == {ForecasterName.LINEAR_TREND}
    assert outlooks[-1].projected_rps > rates[-1]  # it looks ahead on the rise
    assert outlooks[-1].recent_error_ratio is not None


def test_the_sized_rate_is_never_below_the_windows_rate() -> None:
    strategy = ForecastStrategy(ForecastMode.KALMAN, 300.0)
    falling = [100.0 - 2.0 * i for i in range(40)]
    for i, rate in enumerate(falling):
        assert strategy.observe(30.0 * (i + 1), rate).projected_rps >= rate


def test_horizon_zero_is_the_last_value() -> None:
    strategy = ForecastStrategy(ForecastMode.AUTO, 0.0)
    for i in range(40):
        outlook = strategy.observe(30.0 * (i + 1), 10.0 + i)
    assert outlook.projected_rps == 49.0
