"""Arrival and length generators for the simulator, drawn from an injected Generator.

Arrivals are a renewal process run in "operational time": unit-mean gaps (exponential for
Poisson, gamma with a given coefficient of variation, or exactly 1 for a constant rate) are laid
out on the cumulative-intensity axis Lambda(t) = integral of the rate, then mapped back to wall
time through Lambda^-1. With a constant rate this is the plain renewal process; with a piecewise
linear `RateProfile` (holds and ramps, paper Table IV) it is the time-changed process, which
for Poisson is exactly the non-homogeneous Poisson process. `ArrivalStream` draws incrementally,
so a live rate change (the emulator's `set_rate_rps`) keeps the gap in progress.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
from numpy.typing import NDArray

from model.queueing.validation import (
    require_at_least,
    require_int_at_least,
    require_non_negative,
    require_positive,
)

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

POISSON_CV = 1.0
BIMODAL_SHORT_SHARE = 0.8
DEFAULT_LOGNORMAL_CV = 0.5
_GAP_BLOCK = 1024
# Table IV of the paper: (duration min, start multiplier, end multiplier).
PAPER_PROFILE_SEGMENTS: tuple[tuple[float, float, float], ...] = (
    (5, 1.0, 1.0),
    (3, 1.0, 2.5),
    (8, 2.5, 2.5),
    (3, 2.5, 4.0),
    (8, 4.0, 4.0),
    (3, 4.0, 2.5),
    (6, 2.5, 2.5),
    (3, 2.5, 1.0),
    (5, 1.0, 1.0),
)


def _readonly(arr: NDArray[np.generic]) -> NDArray[np.generic]:
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, slots=True)
class RateSegment:
    """One piece of a rate profile: linear from start_rps to end_rps over duration_s."""

    duration_s: float
    start_rps: float
    end_rps: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "duration_s", require_positive("duration_s", self.duration_s))
        object.__setattr__(self, "start_rps", require_non_negative("start_rps", self.start_rps))
        object.__setattr__(self, "end_rps", require_non_negative("end_rps", self.end_rps))


@dataclass(frozen=True, slots=True)
class RateProfile:
    """Piecewise linear arrival rate (req/s) from t = 0; after the last segment the final rate
    holds forever."""

    segments: tuple[RateSegment, ...]
    _starts_s: FloatArray = field(init=False, repr=False, compare=False)
    _cum: FloatArray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.segments:
            raise ValueError("`segments` must hold at least one RateSegment, got none")
        segs = tuple(self.segments)
        durations = np.array([s.duration_s for s in segs])
        areas = np.array([0.5 * (s.start_rps + s.end_rps) * s.duration_s for s in segs])
        object.__setattr__(self, "segments", segs)
        starts = np.concatenate(([0.0], np.cumsum(durations)))
        object.__setattr__(self, "_starts_s", _readonly(starts))
        object.__setattr__(self, "_cum", _readonly(np.concatenate(([0.0], np.cumsum(areas)))))

    @classmethod
    def constant(cls, rate_rps: float, duration_s: float = 1.0) -> RateProfile:
        """A single hold at rate_rps (it continues past duration_s)."""
        return cls((RateSegment(duration_s, rate_rps, rate_rps),))

    @classmethod
    def paper(cls, base_rps: float) -> RateProfile:
        """The paper's 44-minute profile (Table IV) scaled by a baseline rate in req/s."""
        require_positive("base_rps", base_rps)
        return cls(
            tuple(
                RateSegment(minutes * 60.0, base_rps * lo, base_rps * hi)
                for minutes, lo, hi in PAPER_PROFILE_SEGMENTS
            )
        )

    @property
    def duration_s(self) -> float:
        """End of the last segment (s)."""
        return float(self._starts_s[-1])

    @property
    def final_rps(self) -> float:
        """Rate held after the last segment (req/s)."""
        return self.segments[-1].end_rps

    def rate_at(self, t_s: float | FloatArray) -> FloatArray:
        """Arrival rate (req/s) at time(s) t_s >= 0."""
        t = np.asarray(t_s, dtype=np.float64)
        idx = np.clip(np.searchsorted(self._starts_s, t, side="right") - 1, 0, len(self.segments))
        out = np.full(t.shape, self.final_rps)
        inside = idx < len(self.segments)
        if np.any(inside):
            k = idx[inside]
            r0, r1, d = self._segment_arrays()
            out[inside] = r0[k] + (r1[k] - r0[k]) * (t[inside] - self._starts_s[k]) / d[k]
        return out

    def cumulative(self, t_s: float | FloatArray) -> FloatArray:
        """Expected arrivals in [0, t_s]: Lambda(t) = integral of the rate."""
        t = np.maximum(np.asarray(t_s, dtype=np.float64), 0.0)
        nseg = len(self.segments)
        idx = np.clip(np.searchsorted(self._starts_s, t, side="right") - 1, 0, nseg)
        r0, r1, d = self._segment_arrays()
        out = np.empty(t.shape)
        inside = idx < nseg
        k = idx[inside]
        x = t[inside] - self._starts_s[k]
        out[inside] = self._cum[k] + r0[k] * x + 0.5 * (r1[k] - r0[k]) / d[k] * x * x
        out[~inside] = self._cum[-1] + self.final_rps * (t[~inside] - self.duration_s)
        return out

    def inverse_cumulative(self, u: FloatArray) -> FloatArray:
        """Lambda^-1: the time (s) at which the expected arrivals reach u; inf if never."""
        u = np.asarray(u, dtype=np.float64)
        nseg = len(self.segments)
        # u in (cum[k], cum[k+1]] falls in segment k; zero-rate segments are skipped naturally.
        idx = np.searchsorted(self._cum, u, side="left") - 1
        idx = np.clip(idx, 0, nseg)
        r0, r1, d = self._segment_arrays()
        out = np.full(u.shape, np.inf)
        inside = idx < nseg
        k = idx[inside]
        rem = np.maximum(u[inside] - self._cum[k], 0.0)
        a = 0.5 * (r1[k] - r0[k]) / d[k]
        b = r0[k]
        # Stable root of a x^2 + b x = rem, valid for a = 0 and for b = 0.
        denom = b + np.sqrt(np.maximum(b * b + 4.0 * a * rem, 0.0))
        x = np.divide(2.0 * rem, denom, out=np.zeros_like(rem), where=denom > 0)
        out[inside] = self._starts_s[k] + np.minimum(x, d[k])
        tail = ~inside
        if self.final_rps > 0 and np.any(tail):
            out[tail] = self.duration_s + (u[tail] - self._cum[-1]) / self.final_rps
        return out

    def _segment_arrays(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        r0 = np.array([s.start_rps for s in self.segments])
        r1 = np.array([s.end_rps for s in self.segments])
        d = np.array([s.duration_s for s in self.segments])
        return r0, r1, d


class ArrivalStream:
    """Draws arrival times (s) incrementally from a rate profile and a gap law of given CV
    (0 = constant rate, 1 = Poisson, other = gamma)."""

    def __init__(
        self,
        profile: RateProfile,
        rng: np.random.Generator,
        *,
        cv: float = POISSON_CV,
        start_s: float = 0.0,
    ) -> None:
        self._cv = require_non_negative("cv", cv)
        self._rng = rng
        self._spare = np.empty(0)  # gaps drawn but not used yet: draws come in fixed blocks
        self._profile = profile
        self._offset_s = require_non_negative("start_s", start_s)
        self._cursor_s = self._offset_s
        self._next_u = float(self._gaps(1)[0])  # operational time of the next arrival

    @property
    def cursor_s(self) -> float:
        """Time (s) up to which arrivals have been drawn."""
        return self._cursor_s

    def set_profile(self, profile: RateProfile, at_s: float) -> None:
        """Switch to `profile` (its t = 0 at at_s >= cursor), keeping the gap in progress."""
        if at_s < self._cursor_s:
            raise ValueError(f"`at_s` must be >= the stream cursor {self._cursor_s}, got {at_s}")
        self.draw_until(at_s)
        left_u = self._next_u - float(self._profile.cumulative(at_s - self._offset_s))
        self._profile = profile
        self._offset_s = at_s
        self._next_u = left_u  # the new profile's Lambda starts at 0 at at_s

    def draw_until(self, end_s: float) -> FloatArray:
        """All arrivals in (cursor, end_s], sorted; advances the cursor to end_s."""
        if end_s <= self._cursor_s:
            return np.empty(0)
        end_u = float(self._profile.cumulative(end_s - self._offset_s))
        chunks: list[FloatArray] = []
        while self._next_u <= end_u:
            expected = end_u - self._next_u
            gaps = self._gaps(int(expected * 1.2) + 16)
            points = self._next_u + np.concatenate(([0.0], np.cumsum(gaps)))
            n = min(int(np.searchsorted(points, end_u, side="right")), points.size - 1)
            chunks.append(points[:n])
            self._next_u = float(points[n])
            self._spare = np.concatenate((gaps[n:], self._spare))  # unused gaps stay in order
        self._cursor_s = end_s
        if not chunks:
            return np.empty(0)
        times = self._profile.inverse_cumulative(np.concatenate(chunks)) + self._offset_s
        return np.maximum.accumulate(np.minimum(times, end_s))

    def _gaps(self, count: int) -> FloatArray:
        # Fixed-size blocks make the sequence independent of how draw_until is chunked.
        while self._spare.size < count:
            self._spare = np.concatenate((self._spare, self._block()))
        out, self._spare = self._spare[:count], self._spare[count:]
        return out

    def _block(self) -> FloatArray:
        if self._cv == 0.0:
            return np.ones(_GAP_BLOCK)
        if self._cv == POISSON_CV:
            return self._rng.exponential(1.0, _GAP_BLOCK)
        shape = 1.0 / (self._cv * self._cv)
        return self._rng.gamma(shape, 1.0 / shape, _GAP_BLOCK)


class LengthKind(StrEnum):
    """Token-length distributions."""

    FIXED = "fixed"
    UNIFORM = "uniform"  # integers on [x/2, 3x/2], the paper's validation law (§VI)
    LOGNORMAL = "lognormal"
    BIMODAL = "bimodal"  # 80 % at x/4, 20 % at 4x: mean x, CV 1.5 (percentiles.md §4)
    EMPIRICAL = "empirical"  # resampled from recorded values


@dataclass(frozen=True, slots=True)
class LengthDist:
    """A distribution of token counts (>= 1) with mean `mean_tokens`."""

    kind: LengthKind
    mean_tokens: float = 0.0
    cv: float = DEFAULT_LOGNORMAL_CV
    values: IntArray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", LengthKind(self.kind))
        if self.kind is LengthKind.EMPIRICAL:
            vals = np.asarray(self.values, dtype=np.int64).reshape(-1)
            if vals.size == 0 or np.any(vals < 1):
                raise ValueError(f"`values` must be a non-empty array of integers >= 1, got {vals}")
            object.__setattr__(self, "values", _readonly(vals.copy()))
            object.__setattr__(self, "mean_tokens", float(vals.mean()))
        else:
            require_at_least("mean_tokens", self.mean_tokens, 1)
            require_non_negative("cv", self.cv)

    def sample(self, count: int, rng: np.random.Generator) -> IntArray:
        """`count` token lengths, each >= 1."""
        count = require_int_at_least("count", count, 0)
        x = self.mean_tokens
        match self.kind:
            case LengthKind.FIXED:
                out = np.full(count, max(1, round(x)), dtype=np.int64)
            case LengthKind.UNIFORM:
                low, high = max(1, round(x / 2)), max(1, round(3 * x / 2))
                out = rng.integers(low, high, size=count, endpoint=True, dtype=np.int64)
            case LengthKind.LOGNORMAL:
                sigma2 = math.log1p(self.cv * self.cv)
                draws = rng.lognormal(math.log(x) - sigma2 / 2, math.sqrt(sigma2), count)
                out = np.maximum(np.rint(draws), 1).astype(np.int64)
            case LengthKind.BIMODAL:
                short, long = max(1, round(x / 4)), max(1, round(4 * x))
                out = np.where(rng.random(count) < BIMODAL_SHORT_SHARE, short, long)
            case LengthKind.EMPIRICAL:
                out = rng.choice(np.asarray(self.values), size=count, replace=True)
        return out.astype(np.int64)


@dataclass(frozen=True, slots=True)
class LengthPairs:
    """Recorded (prompt, output) token counts, resampled as pairs: a request keeps both."""

    input_tokens: IntArray
    output_tokens: IntArray

    def __post_init__(self) -> None:
        n_in = np.asarray(self.input_tokens, dtype=np.int64).reshape(-1).copy()
        n_out = np.asarray(self.output_tokens, dtype=np.int64).reshape(-1).copy()
        if n_in.size == 0 or n_in.size != n_out.size or np.any(n_in < 1) or np.any(n_out < 1):
            raise ValueError(
                "`input_tokens` and `output_tokens` must be equally long, non-empty arrays of "
                f"integers >= 1, got {n_in.size} and {n_out.size} values"
            )
        object.__setattr__(self, "input_tokens", _readonly(n_in))
        object.__setattr__(self, "output_tokens", _readonly(n_out))

    def sample(self, count: int, rng: np.random.Generator) -> tuple[IntArray, IntArray]:
        """`count` (prompt, output) pairs drawn with replacement."""
        idx = rng.integers(0, self.input_tokens.size, size=require_int_at_least("count", count, 0))
        return self.input_tokens[idx], self.output_tokens[idx]


def cached_prefix_tokens(input_tokens: IntArray, share: float) -> IntArray:
    """The prompt tokens a prefix cache serves at a hit share in [0, 1): floor(share x n),
    leaving at least one token to compute (vLLM always computes the last one)."""
    if not 0.0 <= share < 1.0:
        raise ValueError(f"`prefix_hit_share` must be a number in [0, 1), got {share}")
    n = np.asarray(input_tokens, dtype=np.int64)
    cached: IntArray = np.minimum(np.floor(share * n).astype(np.int64), n - 1)
    return cached


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """Pre-drawn requests: arrival times (s, sorted), input/output token counts (>= 1) and the
    prompt tokens the prefix cache holds (0 <= cached < input; None: none)."""

    arrival_s: FloatArray
    input_tokens: IntArray
    output_tokens: IntArray
    cached_tokens: IntArray | None = None

    def __post_init__(self) -> None:
        arr = np.asarray(self.arrival_s, dtype=np.float64).reshape(-1).copy()
        n_in = np.asarray(self.input_tokens, dtype=np.int64).reshape(-1).copy()
        n_out = np.asarray(self.output_tokens, dtype=np.int64).reshape(-1).copy()
        if not (arr.size == n_in.size == n_out.size):
            raise ValueError(
                "`arrival_s`, `input_tokens` and `output_tokens` must have the same length, got "
                f"{arr.size}, {n_in.size}, {n_out.size}"
            )
        if arr.size and (not np.all(np.isfinite(arr)) or arr[0] < 0 or np.any(np.diff(arr) < 0)):
            raise ValueError("`arrival_s` must be finite, >= 0 and non-decreasing")
        if np.any(n_in < 1) or np.any(n_out < 1):
            raise ValueError("`input_tokens` and `output_tokens` must all be integers >= 1")
        cached = np.zeros_like(n_in) if self.cached_tokens is None else self.cached_tokens
        cached = np.asarray(cached, dtype=np.int64).reshape(-1).copy()
        if cached.size != n_in.size or np.any(cached < 0) or np.any(cached >= n_in):
            raise ValueError(
                "`cached_tokens` must have one integer per request in [0, input_tokens)"
            )
        object.__setattr__(self, "arrival_s", _readonly(arr))
        object.__setattr__(self, "input_tokens", _readonly(n_in))
        object.__setattr__(self, "output_tokens", _readonly(n_out))
        object.__setattr__(self, "cached_tokens", _readonly(cached))

    def __len__(self) -> int:
        return int(self.arrival_s.size)


def draw_trace(
    profile: RateProfile,
    input_lengths: LengthDist,
    output_lengths: LengthDist,
    rng: np.random.Generator,
    *,
    duration_s: float | None = None,
    cv: float = POISSON_CV,
    pairs: LengthPairs | None = None,
    prefix_hit_share: float = 0.0,
) -> RequestTrace:
    """Requests arriving over [0, duration_s] (default: the profile's length); with `pairs`,
    their lengths are recorded pairs instead of the two laws; `prefix_hit_share` of each
    prompt is in the prefix cache."""
    end_s = profile.duration_s if duration_s is None else require_positive("duration_s", duration_s)
    arrivals = ArrivalStream(profile, rng, cv=cv).draw_until(end_s)
    if pairs is None:
        n_in = input_lengths.sample(arrivals.size, rng)
        n_out = output_lengths.sample(arrivals.size, rng)
    else:
        n_in, n_out = pairs.sample(arrivals.size, rng)
    return RequestTrace(arrivals, n_in, n_out, cached_prefix_tokens(n_in, prefix_hit_share))


def poisson_trace(
    rate_rps: float,
    duration_s: float,
    input_lengths: LengthDist,
    output_lengths: LengthDist,
    rng: np.random.Generator,
) -> RequestTrace:
    """Poisson arrivals at rate_rps over [0, duration_s] with the given length laws."""
    profile = RateProfile.constant(require_positive("rate_rps", rate_rps), duration_s)
    return draw_trace(profile, input_lengths, output_lengths, rng, duration_s=duration_s)
