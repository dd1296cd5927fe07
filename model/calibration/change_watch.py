"""Change detection on the estimate's prediction errors of new points (a CUSUM).

`trust.changed` compares the newest points' errors under the current estimate with the older
points'; but each new point is fitted before the next arrives, so after a modest change (every
parameter 10 % faster) the estimate half-follows the first new points and the third one no
longer stands out, while the old points, at other loads, keep the extrapolation to the SLO
where it was until they leave the window (17 windows). Here every point is judged once, on
arrival, against the estimate made without it (its innovation), per metric (TTFT, ITL):

    z = clip((e - median of the last WATCH_HISTORY innovations since the last call) / sigma,
             -Z_CLIP, Z_CLIP)
    S+ = max(0, S+ + z - ALLOWANCE),  S- = max(0, S- - z - ALLOWANCE)

sigma = 1.4826 x the MAD of the last SCALE_HISTORY innovations, at least SIGMA_FLOOR (a
window's mean latency carries a few % sampling noise). The scale's history is longer than the
centre's and survives a called change: the spread is the traffic's (how much one window's mean
latency scatters), which a change of the deployment does not alter, while the centre is the
estimate's bias, which it does. On lognormal lengths (prompts CV 1.5, bench/replay_trace) the
innovations are heavy-tailed (TTFT spread about 0.1, single windows at -0.2 to -0.5): a MAD
of the last 10, or of the 5 left after a call, read calm stretches as a spread of 0.02-0.03,
so two tail windows, or the return from a few windows the estimate lagged behind, counted as
3-4 sigma each and were called changes (and each call's reset made the next scale from 5
points: calls at points 35, 47 and 61 of that trace's 93, none with this history).

A change is called when S+ or S- exceeds THRESHOLD on either metric and, on that side, the
newest point and at least CHANGE_RUN of the newest RUN_SPAN lie beyond DATE_MARGIN: a change
persists, while the tail windows of heavy-tailed traffic come alone or in pairs (on that trace
a sum of 7.4 from two TTFT windows at -0.5 and -0.2 after a few at -0.1). One of them may fall
short because the estimate follows each new point part of the way: at 128/2048 tokens, every
parameter / 1.1, the third innovation was 1.9 sigma out, three in a row were never seen, and
the old points' slope held the published capacity at 0.75-0.88x the new truth's for 15
windows. It began with the oldest of those points beyond DATE_MARGIN that the next one joins
(not a lone point before the gap; not where the sum last was 0: a sum that lingered a little
above 0 before the change would date it too early; nor ALLOWANCE: an ordinary point 1.2
sigma off just before alpha x1.5 at 1024/512 tokens joined the points kept, and the capacity
took 18 windows to follow, 13 without it; 3 with `judged_by`'s anchor too), and the tuner
keeps only those.
Z_CLIP bounds what one point adds: two 10x TTFT spikes (each +Z_CLIP - ALLOWANCE) stay below
THRESHOLD, while a shift of a few sigma on every new point is called on its third.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from model.calibration.medians import column_medians
from model.calibration.observation import Observation
from model.calibration.residuals import FitProblem
from model.calibration.trust import CHANGE_RUN, FloatArray, changed, robust_spread
from model.queueing.params import ServerConfig, ServiceParams
from model.queueing.variant import ModelOptions

WATCH_HISTORY = 10  # innovations since the last call the centre is read from
WATCH_MIN_HISTORY = 5  # ... at least this many before a change can be called
SCALE_HISTORY = 40  # innovations the spread is read from, across calls
SIGMA_FLOOR = 0.02
ALLOWANCE = 1.0  # in sigmas: a drift below this never accumulates
DATE_MARGIN = 2.0  # in sigmas: the points of a change lie beyond this
Z_CLIP = 4.0
THRESHOLD = 7.0
RUN_SPAN = CHANGE_RUN + 1  # newest points the run is read from: one of them may fall short
# Above this load (of the estimate's saturation rate) a point is not judged: a 30 s window
# there is no steady state (the backlog it starts with, and the rate's Poisson noise amplified
# by the queue, move its mean latency more than any parameter). In bench/replay_trace three
# windows at 0.71-0.88 erred by -0.29, +0.12, +0.14 in ITL and the next, back at 0.44, by
# +0.16 (the estimate had moved toward them): four sigma each, called a change.
WATCH_MAX_LOAD = 0.8


@dataclass(frozen=True, slots=True)
class Innovation:
    """A new point's relative errors [TTFT, ITL] and load (of the saturation rate) under
    `params`, the estimate made without it."""

    errors: FloatArray
    load: float
    params: ServiceParams


def innovate(
    observation: Observation, params: ServiceParams, server: ServerConfig, options: ModelOptions
) -> Innovation:
    """The observation's Innovation under `params`: one model call, which the tuner's
    saturation skip and the change watch both read."""
    errors, load = FitProblem([observation], server, options).relative_errors(params)
    return Innovation(errors[0], float(load[0]), params)


@dataclass(slots=True)
class ChangeWatch:
    """Two-sided CUSUM per metric of the innovations (module docstring)."""

    history: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=WATCH_HISTORY))
    spread: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=SCALE_HISTORY))
    upper: list[float] = field(default_factory=lambda: [0.0, 0.0])
    lower: list[float] = field(default_factory=lambda: [0.0, 0.0])
    # Per side (TTFT up, ITL up, TTFT down, ITL down): were the newest points beyond?
    beyond: list[deque[bool]] = field(
        default_factory=lambda: [deque(maxlen=RUN_SPAN) for _ in range(4)]
    )
    # The estimate each of the newest points was judged by, oldest first (not saved: a
    # restored tuner anchors a change on its current estimate).
    judges: deque[ServiceParams] = field(default_factory=lambda: deque(maxlen=WATCH_HISTORY))

    def add(self, ttft_error: float, itl_error: float) -> int | None:
        """Take one innovation (relative errors (pred - meas) / meas); the number of newest
        points since the change began when one is called (the watch then starts over), else
        None."""
        innovation = (ttft_error, itl_error)
        if not all(np.isfinite(innovation)):
            return None
        called = None
        if len(self.history) >= WATCH_MIN_HISTORY:
            centre = column_medians(np.array(self.history))
            sigma = np.maximum(SIGMA_FLOOR, robust_spread(np.array(self.spread)))
            z = np.clip((np.array(innovation) - centre) / sigma, -Z_CLIP, Z_CLIP)
            for k in range(2):
                self.upper[k] = max(0.0, self.upper[k] + z[k] - ALLOWANCE)
                self.lower[k] = max(0.0, self.lower[k] - z[k] - ALLOWANCE)
            for k, side in enumerate((z[0], z[1], -z[0], -z[1])):
                self.beyond[k].append(bool(side > DATE_MARGIN))
            sums = self.upper + self.lower
            runs = [_run(f) for f, sum_ in zip(self.beyond, sums, strict=True) if sum_ > THRESHOLD]
            called = max(runs, default=0) or None
        if called is not None:
            self._restart()  # the new estimate's innovations describe the changed deployment
        else:
            self.history.append(innovation)
        self.spread.append(innovation)
        return called

    def judge(self, innovation: Innovation) -> int | None:
        """`add` a new point's innovation if its load is at most WATCH_MAX_LOAD."""
        if not innovation.load <= WATCH_MAX_LOAD:
            return None
        self.judges.append(innovation.params)
        return self.add(float(innovation.errors[0]), float(innovation.errors[1]))

    def judged_by(self, newest: int) -> ServiceParams | None:
        """The estimate that judged the oldest of the `newest` points, if still known: the
        estimate before a change that began there. Not the one in force when the change is
        called: its first points were fitted by then, and at alpha x1.5 (1024/512 tokens,
        called on its third point) the estimate after two of them had traded gamma against
        alpha; anchored there the published capacity took 13 windows to follow, 3 from the
        estimate before them."""
        return self.judges[-newest] if 0 < newest <= len(self.judges) else None

    def reset(self) -> None:
        """Start over after a change (the old innovations and estimates describe another
        deployment); the spread's history stays (the traffic's scatter is the same)."""
        self._restart()
        self.judges.clear()

    def _restart(self) -> None:
        self.history.clear()
        self.upper, self.lower = [0.0, 0.0], [0.0, 0.0]
        for flags in self.beyond:
            flags.clear()

    def to_dict(self) -> dict[str, Any]:
        return {
            "history": [list(row) for row in self.history],
            "spread": [list(row) for row in self.spread],
            "upper": list(self.upper),
            "lower": list(self.lower),
            "beyond": [list(flags) for flags in self.beyond],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ChangeWatch:
        """Inverse of to_dict; None (a state saved before the watch existed) starts afresh."""
        watch = cls()
        if data is None:
            return watch
        rows = [(float(a), float(b)) for a, b in data["history"]]
        watch.history.extend(rows)
        # A state saved before the spread had its own history: the centre's rows stand in.
        spread = data.get("spread", data["history"])
        watch.spread.extend((float(a), float(b)) for a, b in spread)
        watch.upper = [float(v) for v in data["upper"]]
        watch.lower = [float(v) for v in data["lower"]]
        # A state saved before: each side's count of newest points beyond in a row.
        flags = data.get("beyond") or [[True] * int(n) for n in data["streak"]]
        if len(watch.upper) != 2 or len(watch.lower) != 2 or len(flags) != 4:
            raise ValueError(f"`change_watch` is malformed, got {dict(data)!r}")
        for side, row in zip(watch.beyond, flags, strict=True):
            side.extend(bool(v) for v in row)
        return watch


def _run(flags: deque[bool]) -> int:
    """Newest points since the change began when they show one, else 0: counted from the oldest
    point beyond that the next one joins (a lone point before a gap is the old deployment's
    noise), with at least CHANGE_RUN points beyond from there and the newest among them."""
    if not flags or not flags[-1]:
        return 0
    seen = list(flags)
    for start, beyond in enumerate(seen):
        joined = start == len(seen) - 1 or seen[start + 1]
        if beyond and joined and sum(seen[start:]) >= CHANGE_RUN:
            return len(seen) - start
    return 0


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
