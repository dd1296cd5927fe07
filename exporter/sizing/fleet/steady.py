"""What the fleet plan reads held steady across cycles, so that noise does not move it.

- Each variant's capacity per replica is published by a `CapacityHold`. Its noise band is
  measured from the variant's own recent estimates (three robust standard deviations, 5-25 %);
  the published value moves when the median of all recent estimates leaves the band around
  it, or at once when the median of the last five steps beyond twice the band (a real change:
  the older estimates are forgotten). A tuner refit every cycle on steady traffic scatters
  its capacity by 10-20 % (the L40S variant of bench/fleet.py's stationary hour: 1.40-1.97
  req/s); followed as read, each swing re-mixed the plan.
- Each model's demand is published by a `StickyDemand`: a rise is followed at once (a scale-up
  is never delayed), a fall only once the demand is below `drop_share` of the held value, so
  the window-to-window scatter of a steady stream does not resize the plan up and down.

Both are per name and pure apart from that memory; a trust change (a variant's own estimate
replacing its prior) publishes the new capacity at once.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The band is this many times the recent estimates' scatter (robust: from the median absolute
# deviation of their logarithms), at least BAND_FLOOR and at most BAND_CEILING (relative).
BAND_SPREADS = 3.0
BAND_FLOOR = 0.05
BAND_CEILING = 0.25
HISTORY = 30  # recent estimates kept per variant (15 minutes of 30 s cycles)
# Until this many estimates are in, the scatter is not known and the band is BAND_UNKNOWN:
# about what refits scattered a newly trusted variant's capacity on bench/fleet.py's
# stationary hour (an L40S at 1.3-1.8 req/s within its first minutes).
BAND_MIN_ESTIMATES = 8
BAND_UNKNOWN = 0.2
MEDIAN_OF = 5  # a step is read on the median of the last few estimates
MAD_TO_SIGMA = 1.4826  # a normal distribution's standard deviation per median absolute deviation
# A step of the recent estimates' median beyond twice the band (at most this) is followed at
# once; within it, the published value moves only when the whole history's median leaves
# the band (a published value set early, off-centre, is re-centred then).
FAST_CEILING = 0.4
# A fall of demand is followed once it is below this share of the demand held.
DEFAULT_DROP_SHARE = 0.85


def noise_band(history: list[float]) -> float:
    """The relative band within which a new estimate is noise, from recent estimates."""
    logs = [math.log(x) for x in history if x > 0]
    if len(logs) < BAND_MIN_ESTIMATES:
        return BAND_UNKNOWN
    centre = statistics.median(logs)
    spread = MAD_TO_SIGMA * statistics.median(abs(x - centre) for x in logs)
    return min(max(BAND_SPREADS * spread, BAND_FLOOR), BAND_CEILING)


@dataclass(slots=True)
class _Held:
    trusted: bool
    published: float
    history: deque[float]


def _moved(value: float, published: float, band: float) -> bool:
    return abs(math.log(value / published)) > math.log1p(band)


class CapacityHold:
    """Per variant, the capacity per replica (req/s) the plan counts on."""

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}

    def publish(self, name: str, capacity_rps: float, trusted: bool) -> float:
        """This cycle's estimate in, the capacity to plan with out."""
        held = self._held.get(name)
        if held is None or held.trusted != trusted or held.published <= 0 or capacity_rps <= 0:
            self._held[name] = _Held(trusted, capacity_rps, deque([capacity_rps], HISTORY))
            return capacity_rps
        band = noise_band(list(held.history))  # measured before this estimate joins it
        held.history.append(capacity_rps)
        recent = list(held.history)[-MEDIAN_OF:]
        if _moved(statistics.median(recent), held.published, min(2.0 * band, FAST_CEILING)):
            # A step beyond twice the noise: follow the recent estimates, forget the older.
            held.history = deque(recent, HISTORY)
            held.published = statistics.median(recent)
        elif _moved(centre := statistics.median(held.history), held.published, band):
            held.published = centre
        return held.published

    def to_dict(self) -> dict[str, Any]:
        return {name: {"trusted": h.trusted, "published": h.published,
                       "history": list(h.history)} for name, h in self._held.items()}

    def restore(self, data: Mapping[str, Any]) -> None:
        """Load what `to_dict` saved; raises ValueError or TypeError on a bad shape."""
        held = {}
        for name, entry in data.items():
            trusted, published = entry["trusted"], _rate(entry["published"])
            history = [_rate(x) for x in entry["history"]][-HISTORY:]
            if not isinstance(trusted, bool) or not history:
                raise ValueError(f"capacity hold {name!r}: {entry!r}")
            held[str(name)] = _Held(trusted, published, deque(history, HISTORY))
        self._held = held

    def band(self, name: str) -> float | None:
        """The variant's noise band now (relative), None before its first estimate."""
        held = self._held.get(name)
        return None if held is None else noise_band(list(held.history))


class StickyDemand:
    """Per model, the demand (req/s) the plan sizes for: up at once, down past a share."""

    def __init__(self, drop_share: float = DEFAULT_DROP_SHARE) -> None:
        if not 0 < drop_share <= 1:
            raise ValueError(f"drop_share: invalid value {drop_share!r}")
        self.drop_share = drop_share
        self._held: dict[str, float] = {}

    def to_dict(self) -> dict[str, float]:
        return dict(self._held)

    def restore(self, data: Mapping[str, Any]) -> None:
        """Load what `to_dict` saved; raises ValueError or TypeError on a bad shape."""
        self._held = {str(name): _rate(x) for name, x in data.items()}

    def publish(self, name: str, demand_rps: float) -> float:
        held = self._held.get(name)
        if held is None or demand_rps > held or demand_rps < self.drop_share * held:
            self._held[name] = demand_rps
            return demand_rps
        return held


def _rate(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"not a number: {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"not a rate: {value!r}")
    return float(value)
