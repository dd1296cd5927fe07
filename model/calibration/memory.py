"""What a tuner remembers besides its window: per parameter the last value the data identified
(the prior's first choice of centre), which parameters the published estimate took from data,
and what the confidence reads (updates held, updates since a detected change, the newest
next-window errors)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from model.calibration.prior import LOG_SIGMAS, CentreSource, Prior
from model.calibration.trust import (
    HELD_OUT_HISTORY,
    FloatArray,
    confidence,
    held_out_error,
    robust_bias,
)
from model.queueing.params import ServiceParams
from model.queueing.validation import (
    require_int_at_least,
    require_non_negative,
    require_positive,
)

# Between two windows of steady traffic the parameters move by about this much (one standard
# deviation of log(theta)): the prior that keeps the published capacity from flapping. At 0.1,
# single-shape 30 s windows with twice the H100 grid's per-point noise moved the capacity 6.1 %
# (p90) from one cycle to the next; at 0.05 with the smoothed bias (BIAS_WEIGHT) 4.1 %. A
# detected change drops it until the window is full again, so it does not slow the following.
STEADY_LOG_SIGMA = 0.05
# Right after a detected change, the estimate before it is every parameter's centre: at
# ESTIMATE_LOG_SIGMA for a parameter the data identified, so the few new points move it as far
# as they show (alpha after a new engine's overhead, every parameter after a faster one), and
# at this width for one the data left open, which then stays near where it was instead of
# being traded against the rest (three points of 128 / 2048 tokens took gamma to 1/8 of the
# truth and the published capacity to 2.8x the new truth's at ESTIMATE_LOG_SIGMA). While the
# points since the change sit at one load they pin two figures (TTFT and ITL there), not three
# parameters: after an estimate that identified every parameter, beta and gamma then keep this
# width too, and the change goes first to alpha, the part of a latency no load moves (at
# 1024/512 tokens the capacity followed alpha x1.5 in 2 windows instead of 10, every parameter
# / 1.1 in 4 instead of 2; bench/tuner_robustness). Not after a partial estimate: at 128/2048
# tokens, gamma open, holding beta as well took every parameter / 1.1 from 4 windows to 8.
CHANGE_LOG_SIGMA = 0.3
# The median bias sizing corrects by moves with each window's noise (a median of ten noisy
# points): each cycle's value is this share of the new median and the rest of the last
# cycle's, started afresh at a detected change (bench/tuner_robustness.py, noisy single shape).
BIAS_WEIGHT = 0.5


@dataclass(slots=True)
class CalibrationMemory:
    """Mutable per-tuner memory (see the module docstring)."""

    anchor: list[float | None] = field(default_factory=lambda: [None, None, None])
    identified: tuple[bool, bool, bool] = (False, False, False)
    held: int = 0
    since_change: int | None = None
    open_at_change: tuple[bool, bool, bool] = (False, False, False)  # not identified then
    held_out: list[float] = field(default_factory=list)  # newest next-window errors, oldest first
    tested: int = 0  # next windows predicted since the first estimate
    cycles: int = 0  # cycles seen (`tick`); not saved: a restored tuner starts its smoothing
    # The smoothed bias and the cycle it is of (None: none yet, or a change since)
    smoothed: tuple[int, tuple[float, float]] | None = None

    def prior(
        self,
        base: Prior,
        seed: ServiceParams | None,
        bounds: tuple[ServiceParams, ServiceParams],
        steady: ServiceParams | None = None,
        *,
        recovering: bool = False,
        one_load: bool = False,
    ) -> Prior:
        """Per parameter: centred on the anchor, else the seed, else `base` (the chain). With
        a `steady` estimate (fitted, no change being recovered from), a narrow Gaussian
        (STEADY_LOG_SIGMA) around it joins, so steady windows move the estimate smoothly: it
        replaces the chain for a parameter the estimate identified, and multiplies it for one
        the estimate did not (the chain's weak pull keeps that one from wandering off).
        `recovering` from a detected change, the anchor of a parameter the estimate before it
        did not identify has the width CHANGE_LOG_SIGMA; so do beta and gamma when that
        estimate identified every parameter and the points since the change sit at `one_load`
        (module docstring, CHANGE_LOG_SIGMA). The centre is clipped into the bounds so a prior
        never pulls outside them."""
        centre = np.log(np.array(base.centre.as_tuple()))
        precision = 1.0 / np.array(base.log_sigma) ** 2
        seeded = None if seed is None else seed.as_tuple()
        one_load_held = one_load and not any(self.open_at_change)
        for k in range(3):
            anchor = self.anchor[k]
            if anchor is not None:
                held = recovering and (self.open_at_change[k] or (k > 0 and one_load_held))
                width = CHANGE_LOG_SIGMA if held else LOG_SIGMAS[CentreSource.ESTIMATE]
                centre[k], precision[k] = math.log(anchor), width**-2
            elif seeded is not None:
                centre[k], precision[k] = math.log(seeded[k]), LOG_SIGMAS[CentreSource.SEED] ** -2
            if steady is not None:
                narrow = STEADY_LOG_SIGMA**-2
                here = math.log(steady.as_tuple()[k])
                if self.identified[k]:
                    centre[k], precision[k] = here, narrow
                else:
                    total = precision[k] + narrow
                    centre[k] += narrow / total * (here - centre[k])  # exact at here
                    precision[k] = total
        low, high = (np.log(np.array(b.as_tuple())) for b in bounds)
        inside = np.exp(np.clip(centre, low, high))
        sigma = precision**-0.5
        return Prior(
            ServiceParams(*(float(v) for v in inside)),
            (float(sigma[0]), float(sigma[1]), float(sigma[2])),
        )

    def accept(self, params: ServiceParams, identified: tuple[bool, bool, bool]) -> None:
        """A fit became the estimate: its identified values become anchors."""
        self.identified = identified
        for k, (value, known) in enumerate(zip(params.as_tuple(), identified, strict=True)):
            if known:
                self.anchor[k] = value
        self.held = 0

    def changed(self, params: ServiceParams, kept: int = 0) -> None:
        """A change was detected: the estimate before it becomes every parameter's centre. The
        few new points then move what they pin (alpha after a new engine's overhead) and leave
        the rest where it was, instead of at the generic centre (which a single shape could
        then trade against what it pins: alpha up, gamma down, the ITL curve flattened). The
        next-window errors of the `kept` newest points (those since the change) measured the
        change, not the estimate that follows it: they leave the record (the change's own
        factor stands for them)."""
        self.anchor = list(params.as_tuple())
        self.since_change, self.smoothed = 0, None
        self.held_out = self.held_out[: max(len(self.held_out) - kept, 0)]
        known = self.identified
        self.open_at_change = (not known[0], not known[1], not known[2])

    def tick(self) -> None:
        """A cycle passed, with a point or without one (the daemon skipped its window). A
        recovery from a detected change lasts that many cycles, not points: counting points
        alone kept the confidence low for as long as none came, which kept them away when the
        hand-over to the reactive count churned pods every window (bench/replay_trace)."""
        self.cycles += 1
        if self.since_change is not None:
            self.since_change += 1

    def smooth_bias(self, median: tuple[float, float]) -> tuple[float, float]:
        """This cycle's bias from the window's median (BIAS_WEIGHT of it, the rest the last
        cycle's smoothed value); the same for every call within a cycle."""
        if self.smoothed is not None and self.smoothed[0] == self.cycles:
            return self.smoothed[1]
        last = self.smoothed
        value = median
        if last is not None and last[0] == self.cycles - 1:
            value = (
                BIAS_WEIGHT * median[0] + (1.0 - BIAS_WEIGHT) * last[1][0],
                BIAS_WEIGHT * median[1] + (1.0 - BIAS_WEIGHT) * last[1][1],
            )
        self.smoothed = (self.cycles, value)
        return value

    def record_held_out(self, innovation: FloatArray, window_errors: FloatArray | None) -> None:
        """A new point's relative errors under the estimate made without it, judged after the
        median bias of that estimate's window (`trust.held_out_error`); a window the estimate
        calls saturated, which the replica served without a growing queue, errs infinitely."""
        bias = None if window_errors is None else robust_bias(window_errors)
        error = held_out_error(innovation, bias)
        self.held_out = [*self.held_out, error][-HELD_OUT_HISTORY:]
        self.tested += 1

    def confidence(self, has_estimate: bool, loads_spread: bool, settle: int) -> float:
        """Calibration confidence 0-1 of the estimate (`trust.confidence`)."""
        return confidence(
            has_estimate=has_estimate,
            all_identified=all(self.identified),
            loads_spread=loads_spread,
            held_out=np.array(self.held_out, dtype=float),
            tested=self.tested,
            held_updates=self.held,
            since_change=self.since_change,
            settle=settle,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "anchor": list(self.anchor),
            "identified": list(self.identified),
            "held": self.held,
            "since_change": self.since_change,
            "open_at_change": list(self.open_at_change),
            "held_out": [e if math.isfinite(e) else None for e in self.held_out],
            "tested": self.tested,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], params: ServiceParams | None) -> CalibrationMemory:
        """Inverse of to_dict on a tuner state. A state saved before the memory existed has
        none: its estimate `params` becomes the prior's centre (every parameter anchored), and
        counts as identified unless its fit was partial."""
        if "anchor" not in data:
            memory = cls()
            if params is not None:
                memory.anchor = list(params.as_tuple())
                memory.identified = (not bool(data.get("partial", True)),) * 3
            return memory
        anchor = data["anchor"]
        if not isinstance(anchor, list) or len(anchor) != 3:
            raise ValueError(f"`anchor` must be a list of 3 numbers or nulls, got {anchor!r}")
        flags = [bool(v) for v in data["identified"]]
        if len(flags) != 3:
            raise ValueError(f"`identified` must be 3 flags, got {data['identified']!r}")
        since = data["since_change"]
        opened = [bool(v) for v in data.get("open_at_change", (False, False, False))]
        if len(opened) != 3:
            raise ValueError(f"`open_at_change` must be 3 flags, got {data['open_at_change']!r}")
        held_out = data.get("held_out", [])
        if not isinstance(held_out, list):
            raise ValueError(f"`held_out` must be a list of numbers or nulls, got {held_out!r}")
        return cls(
            anchor=[
                None if v is None else require_positive(f"anchor[{k}]", v)
                for k, v in enumerate(anchor)
            ],
            identified=(flags[0], flags[1], flags[2]),
            held=require_int_at_least("held", data["held"], 0),
            since_change=None if since is None else require_int_at_least("since_change", since, 0),
            open_at_change=(opened[0], opened[1], opened[2]),
            held_out=[
                math.inf if e is None else require_non_negative(f"held_out[{k}]", e)
                for k, e in enumerate(held_out[-HELD_OUT_HISTORY:])
            ],
            tested=require_int_at_least("tested", data.get("tested", len(held_out)), 0),
        )
