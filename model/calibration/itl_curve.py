"""The ITL curve sizing reads: ITL against load at the deployment's own request shape, the same
model fitted to ITL alone over points that span the loads seen since the last change.

Why a second fit: the tuner fits TTFT and ITL together, under the first-token convention its
parameters keep (the first token one decode iteration after the last prefill chunk), while vLLM
emits the first token with the last chunk. On one request shape the fit absorbs the difference
by trading ITL against TTFT, and the trade moves with the load (queueing makes the same
absolute offset a smaller share of TTFT): the estimate's ITL is off by a load-dependent amount,
so a correction read at the window's loads is wrong where the ITL target crosses the curve
outside them. Fitted to ITL alone, the model follows the measured curve; the estimate itself
(published, and sizing TTFT) is left as it is.

Two choices keep the curve's slope:
- the points kept are those that spread the offered loads, not the newest: a steady stretch
  brings points at one load, which pin the level but not the slope (`with_point`);
- each point sits at its occupancy rate (Little's law over the requests the engine held), the
  load its ITL was made by: the sampling noise of a window's arrival count flattens a fitted
  slope (regression dilution), which moved the capacity read at the edge of the loads by 10 %.

The curve is fitted once the points span a rate ratio of at least 1 + MIN_SPREAD; until then
sizing corrects the estimate's ITL instead (exporter.sizing.forecast), and so it does after a change
until MIN_POINTS points have come.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from model.calibration.fit import fit
from model.calibration.observation import Observation
from model.calibration.prior import Prior
from model.calibration.trust import spread_loads
from model.calibration.verdict import within_bounds
from model.queueing.params import ServerConfig, ServiceParams
from model.queueing.variant import ModelOptions

POINTS = 20  # points kept for the curve
NEWEST_KEPT = 3  # the newest points never leave for spreading (a change shows in them first)
MIN_POINTS = 8  # points before a curve is fitted (after a change: the window's were few)
MIN_SPREAD = 0.3  # ... and the highest point's rate over the lowest's, minus 1
# The prior around the tuner's estimate (one standard deviation of each log-parameter): ITL at
# one shape pins a level and a slope, and the prior holds the direction it cannot tell apart.
LOG_SIGMA = 0.5
OUTLIER_ERROR = 0.25  # a point whose ITL the curve misses by more is left out of its fit
REFIT_POINTS = 4  # new points before a curve is refitted (`ItlCurve`)


def curve_rate_rps(observation: Observation) -> float:
    """The load (req/s per replica) the point's ITL is fitted at: its occupancy rate where the
    engine's requests were read, else its rate."""
    return observation.occupancy_rate_rps or observation.rate_rps


def with_point(
    points: Sequence[Observation], new: Observation, size: int = POINTS
) -> list[Observation]:
    """`points` (oldest first) and `new`, at most `size` of them: while there are more, the
    point closest in offered load to another one (relative difference of `rate_rps`) leaves,
    the older of two equally close; never one of the NEWEST_KEPT newest. Spread by the load
    offered, not by occupancy: a window caught in a transient holds an unusual batch at a usual
    rate, and would stay for being unusual."""
    kept = [*points, new]
    while len(kept) > max(size, NEWEST_KEPT):
        rates = np.array([obs.rate_rps for obs in kept])
        gaps = np.abs(rates[:, np.newaxis] - rates[np.newaxis, :]) / rates[:, np.newaxis]
        np.fill_diagonal(gaps, np.inf)
        closest = gaps.min(axis=1)[: len(kept) - NEWEST_KEPT]
        del kept[int(np.argmin(closest))]
    return kept


def load_spread(points: Sequence[Observation]) -> float:
    """The highest point's `rate_rps` over the lowest's, minus 1 (0 without points)."""
    if not points:
        return 0.0
    rates = [obs.rate_rps for obs in points]
    return max(rates) / min(rates) - 1.0


def fit_itl_curve(
    points: Sequence[Observation],
    server: ServerConfig,
    options: ModelOptions,
    centre: ServiceParams,
    bounds: tuple[ServiceParams, ServiceParams],
    start: ServiceParams | None = None,
) -> ServiceParams | None:
    """(alpha, beta, gamma) in ms fitted to the points' ITL alone, each point at
    `curve_rate_rps`, with a weak prior (LOG_SIGMA) centred on `centre` (the tuner's estimate),
    points it misses by more than OUTLIER_ERROR left out (at most a third); None with fewer
    than MIN_POINTS points or a `load_spread` under MIN_SPREAD, or when the fit fails or
    leaves the (lower, upper) `bounds`. `start` (default: `centre`) only warm-starts the fit."""
    if len(points) < MIN_POINTS or load_spread(points) < MIN_SPREAD:
        return None
    at_load = [replace(obs, rate_rps=curve_rate_rps(obs)) for obs in points]
    prior = Prior(centre, (LOG_SIGMA, LOG_SIGMA, LOG_SIGMA))
    result = fit(at_load, server, start or centre, options=options, prior=prior, itl_only=True)
    # A spike (a stalled step, a scrape mid-restart) leaves, worst first, up to a third.
    for _ in range(len(at_load) // 3):
        errors = np.abs(result.residuals[:, 1])
        worst = int(np.argmax(errors))
        if not errors[worst] > OUTLIER_ERROR:
            break
        del at_load[worst]
        result = fit(at_load, server, result.params, options=options, prior=prior, itl_only=True)
    if not result.success or not within_bounds(result.params, *bounds):
        return None
    return result.params


class ItlCurve:
    """One deployment's curve: its points since the last change and their fit, refitted when
    asked once REFIT_POINTS points came since the last fit (at once while there is none): a fit
    costs about as much as the tuner's own, and one point moves a curve of twenty little."""

    def __init__(self, points: Sequence[Observation] = ()) -> None:
        self._points: list[Observation] = []
        self._curve: ServiceParams | None = None
        self._new = 0  # points the last fit has not seen
        self.restart(points)

    @property
    def points(self) -> tuple[Observation, ...]:
        return tuple(self._points)

    @property
    def loads_spread(self) -> bool:
        """The points span more than one operating point (`trust.spread_loads`)."""
        return spread_loads(np.array([curve_rate_rps(obs) for obs in self._points]))

    def add(self, observation: Observation) -> None:
        """A point entered the tuner's window (`with_point`)."""
        self._points = with_point(self._points, observation)
        self._new += 1

    def restart(self, points: Sequence[Observation]) -> None:
        """After a change (or points the tuner dropped): only `points` stay (the newest POINTS)."""
        self._points = list(points)[-POINTS:]
        self._curve, self._new = None, len(self._points)

    def params(
        self,
        server: ServerConfig,
        options: ModelOptions,
        estimate: ServiceParams,
        bounds: tuple[ServiceParams, ServiceParams],
    ) -> ServiceParams | None:
        """The curve: `fit_itl_curve` of the points around the tuner's `estimate`, warm-started
        from the last curve, when due; else the last one."""
        if self._new > 0 and (self._curve is None or self._new >= REFIT_POINTS):
            first = self._curve is None
            self._curve = fit_itl_curve(
                self._points, server, options, estimate, bounds, start=self._curve
            )
            self._new = 0
            if first and self._curve is not None:
                # Deployments that got their first curve in one cycle would refit in step ever
                # after; their loads differ, so a phase read from the newest rate spreads them.
                self._new = int(1e3 * self._points[-1].rate_rps) % REFIT_POINTS
        return self._curve
