"""Compiled inner loops of the percentile assembly (model/queueing/latency_samples.py): Poisson
counts at a probability level (inverse CDF of small counts, the Normal approximation of large
ones) and the occupancy drawn at each probability level. Each
computes, operation for operation, what the numpy code beside it did, one element at a time
instead of one pass over the whole array per step."""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from model.queueing.kernel.jit import compiled

FloatArray = NDArray[np.float64]
MAX_COUNT = 201  # the count's cap, reached only for u within rounding of 1


@compiled
def poisson_count(mean: float, level: float) -> float:
    """The number of k with P(K <= k) < level for K ~ Poisson(mean), the CDF summed term by
    term from k = 0 (at most MAX_COUNT)."""
    pmf = math.exp(-mean)
    cdf = pmf
    k = 0.0
    for step in range(1, MAX_COUNT + 1):
        if not cdf < level:
            break
        k += 1.0
        pmf = pmf * mean
        pmf = pmf / step
        cdf = cdf + pmf
    return k


@compiled
def normal_count(mean: float, z: float) -> float:
    """The Normal approximation of a Poisson(mean) count at standard Normal level z, rounded to
    the nearest integer and floored at 0 (NaN stays NaN, as numpy's maximum keeps it)."""
    count = np.floor(mean + np.sqrt(mean) * z + 0.5)
    return count if (count != count or count >= 0.0) else 0.0


@compiled
def count_at(mean: float, level: float, z: float, largest: float) -> float:
    """A Poisson(mean) count at probability level u (z = the standard Normal quantile of u):
    by inverse CDF up to a mean of `largest`, by the Normal approximation beyond; 0 for a NaN
    mean."""
    if mean <= largest:
        return poisson_count(mean, level)
    if mean > largest:
        return normal_count(mean, z)
    return 0.0


@compiled
def states_at_levels(
    cdf: FloatArray, levels: FloatArray, order: NDArray[np.intp]
) -> NDArray[np.intp]:
    """Per row of a normalised CDF (rows, states) and each level (sorted by `order`): the
    number of states whose CDF is at most the level, at most states - 1. Row k's CDF and
    levels are compared shifted by 2k, as the numpy version compared them in one search."""
    rows, states = cdf.shape
    out = np.empty((rows, levels.shape[0]), dtype=np.intp)
    for r in range(rows):
        offset = 2.0 * r
        i = 0
        for j in range(levels.shape[0]):
            level = levels[order[j]] + offset
            while i < states and cdf[r, i] + offset <= level:
                i += 1
            out[r, order[j]] = min(i, states - 1)
    return out
