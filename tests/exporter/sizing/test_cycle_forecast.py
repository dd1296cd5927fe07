"""The forecaster hook of the cycle: the default (linear_trend) leaves the recommender's own
look-ahead untouched; another forecaster's rate is what the decision sizes for."""

from __future__ import annotations

from typing import Any

import pytest

from exporter.config.values import ForecastMode
from exporter.sizing.cycle import DeploymentCycle
from exporter.sizing.forecast_choice import ForecastStrategy
from exporter.sizing.recommender import Decision
from tests.exporter.sizing.test_recommender import CAPACITY, LLAMA, deployment, observation

RISING = [1.0, 1.3, 1.6, 1.9, 2.2, 2.5]  # x CAPACITY, one window each


def _sized(cycle: DeploymentCycle) -> list[float | None]:
    rates = []
    for i, share in enumerate(RISING):
        decision = cycle.decide(cycle.observe(observation(share * CAPACITY, 3), 30.0 * (i + 1)))
        rates.append(decision.sizing_rate_rps)
    return rates


def test_the_default_forecaster_leaves_the_recommenders_look_ahead_alone() -> None:
    dep = deployment(initial_params=LLAMA, look_ahead_s=90.0)
    assert dep.forecaster is ForecastMode.LINEAR_TREND
    for mode, handed in ((ForecastMode.LINEAR_TREND, False), (ForecastMode.KALMAN, True)):
        cycle = DeploymentCycle(dep, forecaster=ForecastStrategy(mode, 90.0))
        seen: list[float | None] = []
        decide = cycle.recommender.decide

        def spy(
            *args: Any, seen: list[float | None] = seen, decide: Any = decide, **kwargs: Any
        ) -> Decision:
            seen.append(kwargs.get("projected_rps"))
            return decide(*args, **kwargs)  # type: ignore[no-any-return]

        cycle.recommender.decide = spy  # type: ignore[method-assign]
        _sized(cycle)
        assert all((r is not None) is handed for r in seen[1:]), (mode, seen)


def test_another_forecaster_sizes_for_its_own_rate() -> None:
    dep = deployment(initial_params=LLAMA, look_ahead_s=90.0)
    trend, last = DeploymentCycle(dep), DeploymentCycle(dep)
    last.forecaster = ForecastStrategy(ForecastMode.LAST_VALUE, 90.0)
    ahead, now = _sized(trend), _sized(last)
    window_rates = [share * CAPACITY for share in RISING]
    assert all(r is not None for r in ahead + now)
    # The last value sizes for the window's rate (plus the margin): below the rising trend's.
    assert ahead[-1] > now[-1]  # type: ignore[operator]
    margin = now[0] - window_rates[0]  # type: ignore[operator]
    assert now[-1] == pytest.approx(window_rates[-1] + margin, rel=0.05)
