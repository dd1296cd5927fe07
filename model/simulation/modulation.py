"""A two-rate modulated arrival process: a two-state Markov-modulated Poisson process (MMPP-2).

The arrival rate switches between a high and a low level and stays at each for an exponential
time of mean `period_s`. The levels keep the mean rate r: with R = high / low,
high = 2 r R / (1 + R) and low = 2 r / (1 + R). Laid out as a `RateProfile` of holds, Poisson
gaps in operational time (workloads.ArrivalStream) make it exactly the MMPP-2; bursts of this
kind are the largest miss of the mean model (percentiles.md §4).
"""

from __future__ import annotations

import numpy as np

from model.queueing.validation import require_at_least, require_positive
from model.simulation.workloads import RateProfile, RateSegment


def modulated_profile(
    rate_rps: float,
    duration_s: float,
    rng: np.random.Generator,
    *,
    ratio: float,
    period_s: float,
) -> RateProfile:
    """Holds alternating between the high and low rate (req/s) over at least `duration_s`,
    starting in either with equal odds; each lasts an exponential time of mean `period_s`."""
    rate_rps = require_positive("rate_rps", rate_rps)
    duration_s = require_positive("duration_s", duration_s)
    ratio = require_at_least("ratio", ratio, 1.0)
    period_s = require_positive("period_s", period_s)
    levels = (2.0 * rate_rps * ratio / (1.0 + ratio), 2.0 * rate_rps / (1.0 + ratio))
    state = int(rng.integers(0, 2))
    segments: list[RateSegment] = []
    covered = 0.0
    while covered < duration_s:
        hold = float(rng.exponential(period_s))
        if hold <= 0.0:
            continue
        segments.append(RateSegment(hold, levels[state], levels[state]))
        covered += hold
        state = 1 - state
    return RateProfile(tuple(segments))
