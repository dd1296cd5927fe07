"""A histogram over one window, and what its buckets tell. percentiles.md §2.

`WindowHistogram` holds the observations one Prometheus histogram gained over a window: the
finite upper bounds (`le`), the count in each bucket (the last one above the highest bound),
and the exact `_sum` and `_count`. Shares at a bucket bound are exact (`share_at_most`); a
length's coefficient of variation comes from first and second moments taken inside each
bucket (`length_cv`).

The moments assume values log-uniform inside a bucket (lo, hi]: E[x^k] =
(hi^k - lo^k) / (k ln(hi / lo)). The bucket above the highest bound holds whatever mean the
exact sum leaves for it. On vLLM's 1-2-5 token buckets (simulated, 150-1500 requests) this
reads wide laws within about +-25 %: lognormal CV 1 +10 % (p10-p90 -1 % to +19 %), CV 2 +2 %
(-19 % to +15 %), CV 0.5 +25 %; a bimodal law (80 % at x/4, 20 % at 4x, CV 1.5) -10 %. A bucket
spans a factor 2-2.5, so narrow laws cannot be resolved: uniform on [x/2, 3x/2] (CV 0.29) reads
0.35-0.40 and a fixed length reads about 0.2, depending on where the mean falls on the grid.
Enough to tell narrow (CV < 0.5) from wide (CV > 1), not more.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from bench.baseline.vendor.model.queueing.validation import require_non_negative

FloatArray = NDArray[np.float64]

# Counts are floats (Prometheus values); a bucket this far below 0 is a broken exposition,
# closer is rounding in sums over engines or pods.
_COUNT_TOLERANCE = 1e-6
# A length estimate needs this many observations: below it the CV of any law is noise.
MIN_LENGTH_OBSERVATIONS = 10


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowHistogram:
    """Observations of one histogram over one window: ascending finite upper bounds, the count
    per bucket (len(bounds) + 1: the last is above the highest bound), and the exact sum (the
    histogram's unit) and count."""

    bounds: FloatArray
    counts: FloatArray
    sum: float
    count: float
    _cumulative: FloatArray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        bounds = np.array(self.bounds, dtype=np.float64).reshape(-1)
        counts = np.array(self.counts, dtype=np.float64).reshape(-1)
        if bounds.size == 0 or not np.all(np.isfinite(bounds)) or np.any(np.diff(bounds) <= 0):
            raise ValueError(f"`bounds` must be finite and strictly increasing, got {bounds}")
        if counts.size != bounds.size + 1:
            raise ValueError(
                f"`counts` must hold len(bounds) + 1 = {bounds.size + 1} buckets, got {counts.size}"
            )
        if not np.all(np.isfinite(counts)) or np.any(counts < -_COUNT_TOLERANCE):
            raise ValueError(f"`counts` must be finite and >= 0, got {counts}")
        counts = np.maximum(counts, 0.0)
        object.__setattr__(self, "sum", require_non_negative("sum", self.sum))
        object.__setattr__(self, "count", require_non_negative("count", self.count))
        for arr in (bounds, counts):
            arr.setflags(write=False)
        cumulative = np.cumsum(counts)
        cumulative.setflags(write=False)
        object.__setattr__(self, "bounds", bounds)
        object.__setattr__(self, "counts", counts)
        object.__setattr__(self, "_cumulative", cumulative)

    @classmethod
    def from_cumulative(
        cls, bounds: Sequence[float], cumulative: Sequence[float], *, sum: float, count: float
    ) -> WindowHistogram:
        """From Prometheus's cumulative `le` counts: `bounds` are the finite `le` values and
        `cumulative` has one more entry, the +Inf bucket."""
        cum = np.asarray(cumulative, dtype=np.float64)
        if cum.size != len(bounds) + 1:
            raise ValueError(
                f"`cumulative` must hold len(bounds) + 1 = {len(bounds) + 1} values (the last "
                f"for +Inf), got {cum.size}"
            )
        if np.any(np.diff(cum) < -_COUNT_TOLERANCE):
            raise ValueError(f"`cumulative` must not decrease with `le`, got {cum}")
        return cls(
            bounds=np.asarray(bounds, dtype=np.float64),
            counts=np.diff(cum, prepend=0.0),
            sum=sum,
            count=count,
        )

    @property
    def mean(self) -> float | None:
        """Exact mean (sum / count); None without observations."""
        return self.sum / self.count if self.count > 0 else None

    def share_at_most(self, bound: float) -> float | None:
        """Share of observations <= `bound`, exact when `bound` is a bucket bound; None without
        observations. Between bounds, the share at the bound below (a lower bracket)."""
        total = float(self._cumulative[-1])
        if total <= 0:
            return None
        k = int(np.searchsorted(self.bounds, bound, side="right"))
        return float(self._cumulative[k - 1]) / total if k > 0 else 0.0

    def same_bounds(self, other: WindowHistogram) -> bool:
        """True when both have exactly the same bucket bounds (they can be added)."""
        return self.bounds.shape == other.bounds.shape and bool(
            np.array_equal(self.bounds, other.bounds)
        )

    def __add__(self, other: WindowHistogram) -> WindowHistogram:
        """The observations of both (pods of one deployment, or successive windows)."""
        if not self.same_bounds(other):
            raise ValueError("histograms with different bucket bounds cannot be added")
        return WindowHistogram(
            bounds=self.bounds,
            counts=self.counts + other.counts,
            sum=self.sum + other.sum,
            count=self.count + other.count,
        )


def length_cv(hist: WindowHistogram, *, floor: float = 1.0) -> float | None:
    """Coefficient of variation of a token-length histogram (values >= `floor`) from
    log-uniform first and second moments inside each bucket; None below
    MIN_LENGTH_OBSERVATIONS observations. Module docstring for the resolution."""
    total = float(hist.counts.sum())
    if hist.count < MIN_LENGTH_OBSERVATIONS or total <= 0:
        return None
    lows, highs = _bucket_edges(hist.bounds, floor)
    finite = hist.counts[:-1]
    first = float(np.dot(finite, _log_uniform_moment(lows, highs, 1)))
    second = float(np.dot(finite, _log_uniform_moment(lows, highs, 2)))
    top = float(hist.counts[-1])
    if top > 0:
        # The open top bucket holds the mean the exact sum leaves for it (at least its lower
        # edge); bucket counts and _count agree up to scrape skew.
        left = hist.sum * total / hist.count - first
        top_mean = max(left / top, float(hist.bounds[-1]))
        first += top * top_mean
        second += top * top_mean * top_mean
    # Both moments from the buckets: their ratio cancels most of the within-bucket shape error
    # (with the exact mean instead, lognormal CV 1 read 20 % high rather than 10 %).
    mean = first / total
    return math.sqrt(max(second / total / (mean * mean) - 1.0, 0.0))


def _bucket_edges(bounds: FloatArray, floor: float) -> tuple[FloatArray, FloatArray]:
    """(lo, hi] of each finite bucket; the first starts at `floor` (or is a point there)."""
    lows = np.concatenate(([min(floor, float(bounds[0]))], bounds[:-1]))
    return lows, bounds.copy()


def _log_uniform_moment(lows: FloatArray, highs: FloatArray, k: int) -> FloatArray:
    """E[x^k] of x log-uniform on (lo, hi]; x = hi where the bucket is a point."""
    lo = np.maximum(lows, 1e-300)
    ratio = np.log(highs / lo)
    point = ratio <= 1e-12
    safe = np.where(point, 1.0, ratio)
    moment = (highs**k - lo**k) / (k * safe)
    return np.where(point, highs**k, moment)
