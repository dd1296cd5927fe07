"""The forecaster a deployment sizes with, chosen on its own history: every cycle each
forecaster (exporter.sizing.forecasters) predicts the rate one horizon ahead, and once that
time comes its prediction is scored against the rate read then (a rolling-origin backtest at
the horizon, on the quantity sizing uses: the look-ahead never sizes below the window's rate).

`auto` starts on the last value and moves to another forecaster only when its recent mean
absolute error is below the last value's by SWITCH_GAIN; it falls back to the last value as
soon as the one it uses does no better than the last value over the same windows. A fixed
choice sizes with that forecaster whatever its error (its error is still reported)."""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from exporter.config.values import ForecastMode
from exporter.sizing.demand_history import DAY_S, DemandHistory
from exporter.sizing.forecasters import POINT_FORECASTERS, ForecasterName, point_forecasts
from exporter.sizing.startup import StartupClock

# Scored predictions kept per forecaster: the last hour of 30-s cycles.
ERROR_WINDOWS = 120
# Scored predictions a forecaster needs before it can be chosen (and before a fallback).
MIN_SCORED = 20
# A forecaster replaces the last value only with a recent error this much lower: a tie keeps
# the last value, and the margin keeps two close forecasters from taking turns.
SWITCH_GAIN = 0.10
# The upper band: this quantile of the last value's recent under-forecasts is added to it.
UPPER_QUANTILE = 0.9


@dataclass(frozen=True, slots=True, kw_only=True)
class Outlook:
    """This cycle's look-ahead: the rate to size for and what gave it."""

    forecaster: ForecasterName
    horizon_s: float
    projected_rps: float  # never below the window's rate
    recent_error_ratio: float | None  # its mean absolute error / the mean rate (None: unscored)


def held_for_rise(current: int, rate_rps: float, projected_rps: float) -> int:
    """The replicas a fleet whose `current` replicas serve `rate_rps` with margin needs for the
    rise to `projected_rps` the look-ahead expects, each at today's per-replica rate: the
    evidence's hold (exporter.sizing.evidence.holds_load) vouches for today's load only, and a
    forecast held to today's count orders nothing ahead (on the diurnal day at a 300-s startup,
    Holt-Winters asked for a third replica at 1770 s and was held at two until 1890 s, while
    the rate rose from 19 to 25 req/s: 7 windows missed as the third replica started).
    A forecaster's rise only, the configured one's or the backtest's pick: the recommender's
    own linear trend (the default) stays held, its slope over four windows is mostly noise
    where the hold matters (let through, it took the replay suite's diurnal day from 0.95 to
    1.14 replica-hours at 100 % met, and bench/forecast.py's bursty trace at a 90-s startup
    from 2.39 to 3.14 for the same 13 windows missed)."""
    if current < 1 or not rate_rps > 0 or not projected_rps > rate_rps:
        return current
    return max(current, math.ceil(current * projected_rps / rate_rps - 1e-9))


class ForecastStrategy:
    """A deployment's forecasters, their backtest, and the choice between them."""

    def __init__(
        self,
        mode: ForecastMode,
        horizon_s: float,
        *,
        season_s: float = DAY_S,
        bucket_s: float | None = None,
    ) -> None:
        if not (math.isfinite(horizon_s) and horizon_s >= 0):
            raise ValueError(f"`horizon_s` must be a number >= 0, got {horizon_s}")
        self.mode = mode
        self.configured_horizon_s = horizon_s
        self.startup = StartupClock()  # the pods' own startup delay (exporter.sizing.startup)
        self.history = DemandHistory(season_s, bucket_s)
        self.chosen = (
            ForecasterName.LAST_VALUE if mode is ForecastMode.AUTO else ForecasterName(mode.value)
        )
        # (due time s, each forecaster's sized rate) of the predictions not scored yet.
        self._pending: deque[tuple[float, dict[ForecasterName, float]]] = deque()
        self._errors: dict[ForecasterName, deque[float]] = {
            name: deque(maxlen=ERROR_WINDOWS) for name in ForecasterName
        }  # actual - predicted, of the scored predictions
        self._actuals: deque[float] = deque(maxlen=ERROR_WINDOWS)
        self.choices: Counter[ForecasterName] = Counter()  # cycles each one sized
        # A fixed choice computes its own forecast and the last value's (its upper band) only.
        self._computed = (
            tuple(POINT_FORECASTERS) if mode is ForecastMode.AUTO
            else (ForecasterName.LAST_VALUE, self.chosen)
        )  # fmt: skip

    @property
    def horizon_s(self) -> float:
        """How far ahead (s): the startup delay the deployment's own pods showed, else the
        configured one; 0 (no look-ahead) stays 0."""
        measured = self.startup.measured_s
        if self.configured_horizon_s <= 0 or measured is None:
            return self.configured_horizon_s
        return measured

    def observe(self, now_s: float, rate_rps: float) -> Outlook:
        """A window's rate read at `now_s` (s): score the predictions now due, predict the
        rate one horizon ahead with each forecaster, and say which one sizes."""
        self.history.add(now_s, rate_rps)
        self._score(now_s, rate_rps)
        series = self.history.series()
        if not series.recent:
            return Outlook(forecaster=ForecasterName.LAST_VALUE, horizon_s=self.horizon_s,
                           projected_rps=max(rate_rps, 0.0), recent_error_ratio=None)  # fmt: skip
        rate = series.last_rps
        raw = point_forecasts(series, self.horizon_s, self._computed)
        sized = {name: max(rate, rate if value is None else value) for name, value in raw.items()}
        if self.mode in (ForecastMode.AUTO, ForecastMode.UPPER_QUANTILE):
            sized[ForecasterName.UPPER_QUANTILE] = rate + self._upper_band()
        if self.chosen not in sized:  # not computed (a fixed choice): its own is the last
            sized[self.chosen] = rate
        self._pending.append((now_s + self.horizon_s, sized))
        if self.mode is ForecastMode.AUTO:
            self.chosen = self._choose()
        self.choices[self.chosen] += 1
        return Outlook(
            forecaster=self.chosen, horizon_s=self.horizon_s,
            projected_rps=sized[self.chosen], recent_error_ratio=self.error_ratio(self.chosen),
        )  # fmt: skip

    def _score(self, now_s: float, rate_rps: float) -> None:
        """Predictions due by now are scored against this window's rate (the first read at
        or after their due time)."""
        while self._pending and self._pending[0][0] <= now_s + 1e-6:
            _, sized = self._pending.popleft()
            for name, value in sized.items():
                self._errors[name].append(rate_rps - value)
            self._actuals.append(rate_rps)

    def _upper_band(self) -> float:
        """The UPPER_QUANTILE of the last value's recent under-forecasts (0 before any)."""
        errors = self._errors[ForecasterName.LAST_VALUE]
        if not errors:
            return 0.0
        return max(float(np.quantile(np.fromiter(errors, float), UPPER_QUANTILE)), 0.0)

    def mae(self, name: ForecasterName) -> float | None:
        """Mean absolute error (req/s) of its last scored predictions (None: too few)."""
        errors = self._errors[name]
        if len(errors) < MIN_SCORED:
            return None
        return float(np.mean(np.abs(np.fromiter(errors, float))))

    def error_ratio(self, name: ForecasterName) -> float | None:
        """Its mean absolute error over the mean rate of the same windows."""
        mae = self.mae(name)
        mean = float(np.mean(np.fromiter(self._actuals, float))) if self._actuals else 0.0
        if mae is None or mean <= 0:
            return None
        return mae / mean

    def _choose(self) -> ForecasterName:
        """Auto: stay with the current choice while it beats the last value; fall back when
        it does not; move to the best point forecaster when it beats the last value by
        SWITCH_GAIN (the upper band is a margin, not a point forecast: never chosen here)."""
        base = self.mae(ForecasterName.LAST_VALUE)
        if base is None:
            return ForecasterName.LAST_VALUE
        current = self.chosen
        kept = self.mae(current)
        if current is not ForecasterName.LAST_VALUE and (kept is None or kept >= base):
            current = ForecasterName.LAST_VALUE  # the fallback
        scored: dict[ForecasterName, float] = {
            name: mae
            for name in ForecasterName
            if name is not ForecasterName.UPPER_QUANTILE and (mae := self.mae(name)) is not None
        }
        best = min(scored, key=lambda n: scored[n])
        bar = base if current is ForecasterName.LAST_VALUE or kept is None else kept
        if best is not current and scored[best] < (1 - SWITCH_GAIN) * bar:
            return best
        return current

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: the history and the startup delays measured (the backtest restarts, on
        the restored history)."""
        return {"history": self.history.to_dict(), "startup": self.startup.to_dict()}

    def restore(self, data: Any, now_s: float) -> None:
        if isinstance(data, dict):
            self.history.restore(data.get("history"), now_s)
            self.startup.restore(data.get("startup"))
