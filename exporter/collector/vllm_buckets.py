"""Histogram buckets of one pod's vLLM series, summed over engines per `le`. percentiles.md §2.

vLLM's bucket bounds are configurable and version-dependent (ecosystem §1.1), so they are read
from every sample, never assumed. A pod's buckets of one histogram are usable only whole: every
series (engine) must carry the same finite bounds plus +Inf, each `le` must parse, and the
cumulative counts must not decrease with `le`. Anything else is a parse problem: the histogram
keeps its `_sum`/`_count` means but has no buckets, and the pod sample names it in
`bad_buckets`. The window deltas (`bucket_delta`) follow the counters' rules: a restart counts
from zero; bounds that change between the window's two samples give no delta.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from model.calibration.histogram import WindowHistogram

LE_LABEL = "le"
BUCKET_SUFFIX = "_bucket"


@dataclass(frozen=True, slots=True)
class CumulativeBuckets:
    """A histogram's cumulative counts at one instant: finite `le` bounds (ascending) and the
    counts at each, then the +Inf count (len(bounds) + 1 values)."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]


class BucketAccumulator:
    """Collects one pod's `_bucket` samples per histogram and series, then sums the series."""

    def __init__(self) -> None:
        # base name -> series identity (labels without le) -> le -> value
        self._series: dict[str, dict[frozenset[tuple[str, str]], dict[float, float]]] = {}
        self._broken: set[str] = set()

    def add(self, base: str, labels: Mapping[str, str], value: float) -> None:
        """One `<base>_bucket` sample; an `le` that does not parse breaks the histogram."""
        try:
            le = float(labels[LE_LABEL])
        except (KeyError, ValueError):
            self._broken.add(base)
            return
        if math.isnan(le) or le == -math.inf:
            self._broken.add(base)
            return
        key = frozenset((k, v) for k, v in labels.items() if k not in (LE_LABEL, "__name__"))
        self._series.setdefault(base, {}).setdefault(key, {})[le] = value

    def result(self) -> tuple[dict[str, CumulativeBuckets], frozenset[str]]:
        """Summed buckets per base name, and the base names whose buckets are unusable."""
        out: dict[str, CumulativeBuckets] = {}
        broken = set(self._broken)
        for base, series in self._series.items():
            if base in broken or all(set(by_le) == {math.inf} for by_le in series.values()):
                continue  # a +Inf bucket alone says nothing _count does not: no buckets
            summed = _sum_series(series.values())
            if summed is None:
                broken.add(base)
            else:
                out[base] = summed
        return out, frozenset(broken)


def _sum_series(series: Iterable[dict[float, float]]) -> CumulativeBuckets | None:
    """Sum per `le` over series with identical bounds; None if bounds differ, +Inf is missing
    or a series' counts decrease with `le`."""
    bounds: tuple[float, ...] | None = None
    totals: list[float] = []
    for by_le in series:
        les = tuple(sorted(by_le))
        if not les or les[-1] != math.inf:
            return None
        counts = [by_le[le] for le in les]
        if any(b < a for a, b in zip(counts, counts[1:], strict=False)):
            return None
        if bounds is None:
            bounds, totals = les, counts
        elif les != bounds:
            return None
        else:
            totals = [a + b for a, b in zip(totals, counts, strict=True)]
    if bounds is None or len(bounds) < 2:
        return None
    return CumulativeBuckets(bounds[:-1], tuple(totals))


def bucket_delta(
    start: CumulativeBuckets | None,
    end: CumulativeBuckets,
    *,
    reset: bool,
    sum_delta: float,
    count_delta: float,
) -> WindowHistogram | None:
    """The window's histogram from cumulative buckets at its two ends (start None or `reset`:
    counted from zero); None when the bounds changed or a bucket fell."""
    if reset:
        cumulative = end.cumulative
    elif start is None or start.bounds != end.bounds:
        return None
    else:
        cumulative = tuple(b - a for a, b in zip(start.cumulative, end.cumulative, strict=True))
        if any(c < 0 for c in cumulative):
            return None
    try:
        return WindowHistogram.from_cumulative(
            end.bounds, cumulative, sum=max(sum_delta, 0.0), count=max(count_delta, 0.0)
        )
    except ValueError:
        return None  # counts that fall with `le` within the window: not a histogram
