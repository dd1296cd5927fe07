"""The forecasters of the arrival rate: bounded whatever their history, and the linear trend
is the recommender's own look-ahead."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.sizing import recommender
from exporter.sizing.forecasters import (
    MAX_GROWTH,
    TREND_WINDOWS,
    ForecasterName,
    Series,
    bounded,
    holt_winters,
    kalman,
    linear_trend,
    point_forecasts,
)

RATES = st.floats(min_value=0.0, max_value=1e4, allow_nan=False, allow_infinity=False)


def _series(rates: list[float], buckets: list[float | None] | None = None) -> Series:
    recent = [(30.0 * (i + 1), r) for i, r in enumerate(rates)]
    return Series(recent=recent, buckets=buckets or (), start_s=0.0, bucket_s=60.0,
                  season_s=600.0)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    rates=st.lists(RATES, min_size=1, max_size=50),
    buckets=st.lists(st.one_of(st.none(), RATES), max_size=40),
    horizon=st.floats(min_value=0.0, max_value=1e5),
)
def test_no_forecaster_returns_a_negative_or_non_finite_rate(
    rates: list[float], buckets: list[float | None], horizon: float
) -> None:
    series = _series(rates, buckets)
    highest = max(rates + [b for b in buckets if b is not None])
    for name, value in point_forecasts(series, horizon).items():
        if value is None:
            continue
        assert math.isfinite(value) and value >= 0, (name, value)
        assert value <= MAX_GROWTH * highest + 1e-9, (name, value)


def test_a_falling_series_far_ahead_is_floored_at_zero() -> None:
    series = _series([100.0 - 10.0 * i for i in range(10)])
    raw = kalman(series, 3600.0)
    assert raw is not None and raw < 0  # the filter's own line goes below zero...
    assert point_forecasts(series, 3600.0)[ForecasterName.KALMAN] == 0.0  # ...sizing never


def test_non_finite_values_fall_back_to_the_last_value() -> None:
    series = _series([5.0, 6.0])
    assert bounded(math.nan, series) == 6.0
    assert bounded(math.inf, series) == 6.0
    assert bounded(None, series) == 6.0


def test_a_runaway_slope_is_capped() -> None:
    series = _series([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0])
    value = point_forecasts(series, 1e6)[ForecasterName.LINEAR_TREND]
    assert value == pytest.approx(MAX_GROWTH * 64.0)


def test_the_linear_trend_is_the_recommenders_look_ahead() -> None:
    assert TREND_WINDOWS == recommender.TREND_WINDOWS
    rates = [10.0, 12.0, 11.0, 15.0, 16.0]
    series = _series(rates)
    t = np.array([p[0] for p in series.recent[-TREND_WINDOWS:]])
    r = np.array(rates[-TREND_WINDOWS:])
    slope = float(np.polyfit(t - t[-1], r, 1)[0])
    assert linear_trend(series, 90.0) == pytest.approx(16.0 + slope * 90.0)


def test_holt_winters_needs_two_seasons_then_sees_the_season() -> None:
    season = [10.0 + 5.0 * math.sin(2 * math.pi * i / 10) for i in range(10)]
    one = Series(recent=[(600.0, season[0])], buckets=season, bucket_s=60.0, season_s=600.0)
    assert holt_winters(one, 120.0) is None
    # Three repeats of the season; now is the start of the next one, where the rate rises.
    two = Series(recent=[(1800.0, season[0])], buckets=season * 3, bucket_s=60.0,
                 season_s=600.0)  # fmt: skip
    value = holt_winters(two, 120.0)
    assert value is not None and value > season[0] + 2.0
