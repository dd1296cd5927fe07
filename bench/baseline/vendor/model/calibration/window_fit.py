"""The two passes around a window fit that keep bad points out of it: trimming (spikes) and,
before the first estimate, leaving out points the fit would put at saturation."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from bench.baseline.vendor.model.calibration.fit import FitResult
from bench.baseline.vendor.model.calibration.observation import Observation
from bench.baseline.vendor.model.calibration.residuals import FitProblem
from bench.baseline.vendor.model.queueing.params import ServerConfig, ServiceParams
from bench.baseline.vendor.model.queueing.variant import ModelOptions

# No estimate yet: a point the first fit puts at this load or above looks saturated.
COLD_MAX_LOAD = 0.9
MIN_POINTS = 3  # a fit with its prior needs at least this many points

Refit = Callable[[list[Observation], ServiceParams | None], FitResult]


def trimmed(
    kept: list[Observation], result: FitResult, refit: Refit, threshold: float, max_trim: int
) -> tuple[FitResult, tuple[Observation, ...]]:
    """While the worst point's error norm sqrt(e_T^2 + e_I^2) exceeds `threshold` (0: never),
    leave it out and refit warm, at most `max_trim` times; returns the last fit and the points
    left out, worst first. `kept` is consumed."""
    dropped: list[Observation] = []
    while threshold > 0 and len(dropped) < max_trim:
        scores = np.hypot(result.residuals[:, 0], result.residuals[:, 1])
        worst = int(np.argmax(scores))
        if not scores[worst] > threshold:
            break
        dropped.append(kept.pop(worst))
        result = refit(kept, result.params)
    return result, tuple(dropped)


def without_saturated(
    kept: list[Observation],
    result: FitResult,
    refit: Refit,
    server: ServerConfig,
    options: ModelOptions,
) -> tuple[list[Observation], FitResult]:
    """A cold fit can bend itself until a saturated window sits just under its saturation
    rate: points the fit puts at COLD_MAX_LOAD or above are left out and the rest refitted
    (with the prior), unless that would leave fewer than MIN_POINTS. Returns the points kept
    and the fit."""
    _, load = FitProblem(kept, server, options).relative_errors(result.params)
    near = load >= COLD_MAX_LOAD
    if not near.any() or len(kept) - int(near.sum()) < MIN_POINTS:
        return kept, result
    rest = [obs for obs, out in zip(kept, near, strict=True) if not out]
    return rest, refit(rest, None)
