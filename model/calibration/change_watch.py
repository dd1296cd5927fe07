"""Change detection on the estimate's prediction errors of new points (a CUSUM).

`trust.changed` compares the newest points' errors under the current estimate with the older
points'; but each new point is fitted before the next arrives, so after a modest change (every
parameter 10 % faster) the estimate half-follows the first new points and the third one no
longer stands out, while the old points, at other loads, keep the extrapolation to the SLO
where it was until they leave the window (17 windows). Here every point is judged once, on
arrival, against the estimate made without it (its innovation), per metric (TTFT, ITL):

    z = clip((e - median of the last WATCH_HISTORY innovations) / sigma, -Z_CLIP, Z_CLIP)
    S+ = max(0, S+ + z - ALLOWANCE),  S- = max(0, S- - z - ALLOWANCE)

sigma = 1.4826 x their MAD, at least SIGMA_FLOOR (a window's mean latency carries a few %
sampling noise). A change is called when S+ or S- exceeds THRESHOLD on either metric; it
began with the oldest of the newest points that each lie beyond ALLOWANCE on the change's
side (not where the sum last was 0: a sum that lingered a little above 0 before the change
would date it too early), and the tuner keeps only those. Z_CLIP bounds what one point adds:
two 10x TTFT spikes (each +Z_CLIP - ALLOWANCE) stay below THRESHOLD, while a shift of a few
sigma on every new point is called after two or three of them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from model.calibration.observation import Observation
from model.calibration.residuals import FitProblem
from model.calibration.trust import CHANGE_RUN, MAD_TO_SIGMA, changed
from model.queueing.params import ServerConfig, ServiceParams
from model.queueing.variant import ModelOptions

WATCH_HISTORY = 10  # innovations the centre and spread are read from
WATCH_MIN_HISTORY = 5  # ... at least this many before a change can be called
SIGMA_FLOOR = 0.02
ALLOWANCE = 1.0  # in sigmas: a drift below this never accumulates
Z_CLIP = 4.0
THRESHOLD = 7.0


@dataclass(slots=True)
class ChangeWatch:
    """Two-sided CUSUM per metric of the innovations (module docstring)."""

    history: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=WATCH_HISTORY))
    upper: list[float] = field(default_factory=lambda: [0.0, 0.0])
    lower: list[float] = field(default_factory=lambda: [0.0, 0.0])
    streak: list[int] = field(default_factory=lambda: [0, 0, 0, 0])  # newest points beyond

    def add(self, ttft_error: float, itl_error: float) -> int | None:
        """Take one innovation (relative errors (pred - meas) / meas); the number of newest
        points since the change began when one is called (the watch then starts over), else
        None."""
        innovation = (ttft_error, itl_error)
        if not all(np.isfinite(innovation)):
            return None
        called = None
        if len(self.history) >= WATCH_MIN_HISTORY:
            past = np.array(self.history)
            centre = np.median(past, axis=0)
            sigma = np.maximum(SIGMA_FLOOR, MAD_TO_SIGMA * np.median(np.abs(past - centre), axis=0))
            z = np.clip((np.array(innovation) - centre) / sigma, -Z_CLIP, Z_CLIP)
            for k in range(2):
                self.upper[k] = max(0.0, self.upper[k] + z[k] - ALLOWANCE)
                self.lower[k] = max(0.0, self.lower[k] - z[k] - ALLOWANCE)
            for k, side in enumerate((z[0], z[1], -z[0], -z[1])):
                self.streak[k] = self.streak[k] + 1 if side > ALLOWANCE else 0
            sums = self.upper + self.lower
            over = [self.streak[k] for k in range(4) if sums[k] > THRESHOLD]
            if over:
                called = max(1, max(over))
        if called is not None:
            self.reset()  # the new estimate's innovations describe the changed deployment
        else:
            self.history.append(innovation)
        return called

    def judge(
        self,
        observation: Observation,
        params: ServiceParams,
        server: ServerConfig,
        options: ModelOptions,
    ) -> int | None:
        """`add` the observation's errors under `params`, the estimate made without it."""
        errors, _ = FitProblem([observation], server, options).relative_errors(params)
        return self.add(float(errors[0, 0]), float(errors[0, 1]))

    def reset(self) -> None:
        """Start over (after a change the old innovations describe another deployment)."""
        self.history.clear()
        self.upper, self.lower, self.streak = [0.0, 0.0], [0.0, 0.0], [0, 0, 0, 0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "history": [list(row) for row in self.history],
            "upper": list(self.upper),
            "lower": list(self.lower),
            "streak": list(self.streak),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ChangeWatch:
        """Inverse of to_dict; None (a state saved before the watch existed) starts afresh."""
        watch = cls()
        if data is None:
            return watch
        rows = [(float(a), float(b)) for a, b in data["history"]]
        watch.history.extend(rows)
        watch.upper = [float(v) for v in data["upper"]]
        watch.lower = [float(v) for v in data["lower"]]
        watch.streak = [int(v) for v in data["streak"]]
        if len(watch.upper) != 2 or len(watch.lower) != 2 or len(watch.streak) != 4:
            raise ValueError(f"`change_watch` is malformed, got {dict(data)!r}")
        return watch


def points_since_change(
    began: int | None,
    window: list[Observation],
    params: ServiceParams,
    server: ServerConfig,
    options: ModelOptions,
) -> int | None:
    """How many newest points of `window` to keep after a change: `began` when the watch
    called one, else CHANGE_RUN when those newest points show one (`trust.changed`), else None."""
    if began is not None or len(window) <= CHANGE_RUN:
        return began
    errors, _ = FitProblem(window, server, options).relative_errors(params)
    return CHANGE_RUN if changed(errors) else None
