"""Forecasters of a deployment's arrival rate one horizon (its startup delay) ahead: pure
functions of its recent windows and its downsampled day (exporter.sizing.demand_history).

- last value: the window's own rate (no look-ahead);
- linear trend: the least-squares slope of the last TREND_WINDOWS windows, rises only (the
  recommender's look-ahead, exporter.sizing.recommender.projected_rate);
- Kalman: a local linear trend (level and slope as a random walk each) over the recent
  windows, noise variances from the windows' own second differences;
- Holt-Winters: additive level, trend and daily season on the downsampled history, once it
  holds two seasons (its own smoothed level, not the window's noisy rate, is the anchor).

Each answers None when its history does not allow it (the caller uses the last value) and is
bounded by `bounded`: never negative, never non-finite, never above MAX_GROWTH x the highest
rate seen.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

# The linear trend's windows: the recommender's TREND_WINDOWS (kept equal by a test).
TREND_WINDOWS = 4
# Rates whose window-to-window differences measure the noise a slope is judged against
# (`rising_slope`), and the fewest differences that say anything.
NOISE_WINDOWS = 10
NOISE_MIN_DIFFS = 5
MAD_TO_SD = 1.4826  # a normal's standard deviation per median absolute deviation
# Windows the Kalman filter runs over: 20 minutes of 30-s cycles.
KALMAN_WINDOWS = 40
# Process noise over the observation noise, per window: the level follows a step within
# about 1 / sqrt(LEVEL_NOISE) windows; the slope moves much slower than the level.
LEVEL_NOISE, SLOPE_NOISE = 0.05, 0.002
# Holt-Winters smoothing (per bucket): level, trend, season. A season's profile is learnt
# over a few days; the level follows within a few buckets.
HW_ALPHA, HW_BETA, HW_GAMMA = 0.3, 0.02, 0.3
# Seasons of history Holt-Winters needs (one to initialise, one to check the profile repeats)
# and the share of their buckets that must hold a rate.
HW_SEASONS, HW_COVERAGE = 2, 0.8
# No forecast beyond this multiple of the highest rate seen: a runaway slope orders nothing.
MAX_GROWTH = 3.0


class ForecasterName(StrEnum):
    """The forecasters a deployment can size with (`forecaster` config key, the
    vllm_sizer_forecaster gauge's `forecaster` label)."""

    LAST_VALUE = "last_value"
    LINEAR_TREND = "linear_trend"
    KALMAN = "kalman"
    HOLT_WINTERS = "holt_winters"
    UPPER_QUANTILE = "upper_quantile"  # last value + an upper quantile of its recent misses


@dataclass(frozen=True, slots=True)
class Series:
    """What a forecaster reads: the recent windows, and the history's buckets (mean rate,
    None where nothing was read) from `start_s` on, `bucket_s` each, one season `season_s`."""

    recent: Sequence[tuple[float, float]]  # (cycle time s, rate req/s), oldest first
    buckets: Sequence[float | None] = ()
    start_s: float = 0.0
    bucket_s: float = 300.0
    season_s: float = 86400.0

    @property
    def last_rps(self) -> float:
        return self.recent[-1][1]


def last_value(series: Series, horizon_s: float) -> float | None:
    del horizon_s
    return series.last_rps if series.recent else None


def rising_slope(recent: Sequence[tuple[float, float]], sigmas: float = 0.0) -> float:
    """The rising part (req/s per s; 0 for a falling trend) of the least-squares slope of the
    last TREND_WINDOWS of `recent` ((time s, rate req/s), oldest first), less `sigmas`
    standard errors of that slope under the rates' own noise.

    The noise is read from the differences of the last NOISE_WINDOWS rates, as the median
    absolute deviation around their median: a steady ramp (equal steps) and one step of the
    load leave it at the counting noise, a bursty stream's window rates raise it. With fewer
    than NOISE_MIN_DIFFS differences the slope is taken as it is."""
    fit = recent[-TREND_WINDOWS:]
    if len(fit) < 3:
        return 0.0
    t = np.array([p[0] for p in fit])
    r = np.array([p[1] for p in fit])
    slope = float(np.polyfit(t - t[-1], r, 1)[0])
    diffs = np.diff(np.array([p[1] for p in recent[-NOISE_WINDOWS:]], dtype=float))
    spread = float(np.sqrt(np.sum((t - t.mean()) ** 2)))
    if slope <= 0 or sigmas <= 0 or diffs.size < NOISE_MIN_DIFFS or spread <= 0:
        return max(slope, 0.0)
    # A difference of two windows carries the noise of both: sqrt(2) x one window's.
    noise = MAD_TO_SD * float(np.median(np.abs(diffs - np.median(diffs)))) / math.sqrt(2.0)
    return max(slope - sigmas * noise / spread, 0.0)


def linear_trend(series: Series, horizon_s: float) -> float | None:
    """The recommender's look-ahead: the rate plus the rising slope of the last windows."""
    recent = series.recent[-TREND_WINDOWS:]
    if len(recent) < 3:
        return last_value(series, horizon_s)
    t = np.array([p[0] for p in recent])
    r = np.array([p[1] for p in recent])
    slope = float(np.polyfit(t - t[-1], r, 1)[0])
    return series.last_rps + max(slope, 0.0) * horizon_s


def kalman(series: Series, horizon_s: float) -> float | None:
    """A local linear trend filtered over the recent windows: level + slope x horizon."""
    recent = series.recent[-KALMAN_WINDOWS:]
    if len(recent) < 6:
        return None
    t = np.array([p[0] for p in recent])
    y = np.array([p[1] for p in recent])
    steps = np.diff(t)
    dt = float(np.median(steps))
    if not dt > 0:
        return None
    # Second differences of white noise have variance 6 sigma^2 (a linear trend cancels).
    r = max(float(np.var(np.diff(y, 2))) / 6.0, 1e-6 * max(float(np.mean(y)), 1e-3) ** 2)
    x = np.array([y[0], 0.0])
    p = np.diag([r, r / dt**2])
    for step, obs in zip(steps, y[1:], strict=True):
        f = np.array([[1.0, step], [0.0, 1.0]])
        q = r * (step / dt) * np.diag([LEVEL_NOISE, SLOPE_NOISE / dt**2])
        x = f @ x
        p = f @ p @ f.T + q
        gain = p[:, 0] / (p[0, 0] + r)
        x = x + gain * (obs - x[0])
        p = p - np.outer(gain, p[0, :])
    return float(x[0] + x[1] * horizon_s)


def holt_winters(series: Series, horizon_s: float) -> float | None:
    """Additive Holt-Winters one horizon ahead, from the buckets' level, trend and season
    (None: under HW_SEASONS seasons of history)."""
    m = round(series.season_s / series.bucket_s)
    values = list(series.buckets)
    if m < 2 or len(values) < HW_SEASONS * m or not series.recent:
        return None
    span = values[-HW_SEASONS * m :]
    if sum(v is not None for v in span) < HW_COVERAGE * len(span):
        return None
    filled = _filled(span)
    level = float(np.mean(filled[:m]))
    trend = 0.0
    season = [v - level for v in filled[:m]]
    for i in range(m, len(filled)):
        s = season[i % m]
        previous = level
        level = HW_ALPHA * (filled[i] - s) + (1 - HW_ALPHA) * (level + trend)
        trend = HW_BETA * (level - previous) + (1 - HW_BETA) * trend
        season[i % m] = HW_GAMMA * (filled[i] - level) + (1 - HW_GAMMA) * s
    # Bucket positions (from the last bucket's centre) of now and now + horizon.
    first = series.start_s + (len(values) - len(span)) * series.bucket_s
    last_centre = first + (len(filled) - 0.5) * series.bucket_s
    now_s = series.recent[-1][0]

    # The season's profile smoothed over about a horizon (at least 3 buckets): a noisy bucket
    # would otherwise move the change expected over the horizon by its own noise.
    width = max(3, round(horizon_s / series.bucket_s)) | 1
    kernel = np.ones(width) / width
    padded = np.concatenate([season[-(width // 2) :], season, season[: width // 2]])
    season = list(np.convolve(padded, kernel, mode="valid"))

    def expected(at_s: float) -> float:
        k = (at_s - last_centre) / series.bucket_s
        below = math.floor(k)
        frac = k - below
        i = len(filled) - 1 + below
        s = (1 - frac) * season[i % m] + frac * season[(i + 1) % m]
        return level + trend * k + s

    return expected(now_s + horizon_s)


def _filled(values: Sequence[float | None]) -> list[float]:
    """Gaps carry the previous bucket's rate forward (the first known one backward)."""
    known = next(v for v in values if v is not None)
    out: list[float] = []
    for v in values:
        known = known if v is None else v
        out.append(known)
    return out


POINT_FORECASTERS: dict[ForecasterName, Callable[[Series, float], float | None]] = {
    ForecasterName.LAST_VALUE: last_value,
    ForecasterName.LINEAR_TREND: linear_trend,
    ForecasterName.KALMAN: kalman,
    ForecasterName.HOLT_WINTERS: holt_winters,
}


def bounded(value: float | None, series: Series) -> float:
    """A forecast as sizing may use it: the last value when there is none or it is not
    finite, never negative, never above MAX_GROWTH x the highest rate seen."""
    last = series.last_rps if series.recent else 0.0
    if value is None or not math.isfinite(value):
        return max(last, 0.0) if math.isfinite(last) else 0.0
    seen = [r for _, r in series.recent] + [b for b in series.buckets if b is not None]
    ceiling = MAX_GROWTH * max((r for r in seen if math.isfinite(r)), default=0.0)
    return min(max(value, 0.0), ceiling)


def point_forecasts(
    series: Series, horizon_s: float, names: Collection[ForecasterName] = tuple(POINT_FORECASTERS)
) -> dict[ForecasterName, float | None]:
    """Each named point forecaster's rate at the horizon, bounded (None: its history does not
    allow it yet)."""
    out: dict[ForecasterName, float | None] = {}
    for name, fn in POINT_FORECASTERS.items():
        if name not in names:
            continue
        raw = fn(series, horizon_s) if horizon_s > 0 else last_value(series, horizon_s)
        out[name] = None if raw is None else bounded(raw, series)
    return out
