"""Compiled inner loops of the percentile assembly (model/queueing/latency_samples.py): the
Poisson inverse CDF of small counts and the occupancy drawn at each probability level. Each
computes, operation for operation, what the numpy code beside it did, one element at a time
instead of one pass over the whole array per step."""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from model.queueing.jit import compiled

FloatArray = NDArray[np.float64]
MAX_COUNT = 201  # the count's cap, reached only for u within rounding of 1


@compiled
def poisson_counts(mean: FloatArray, level: FloatArray, largest: float) -> FloatArray:
    """Per element: the number of k with P(K <= k) < level for K ~ Poisson(mean), the CDF
    summed term by term from k = 0 (at most MAX_COUNT); 0 where mean > largest (or NaN), left
    to the caller."""
    out = np.empty(mean.shape[0])
    for j in range(mean.shape[0]):
        m, u = mean[j], level[j]
        if not m <= largest:
            out[j] = 0.0
            continue
        pmf = math.exp(-m)
        cdf = pmf
        k = 0.0
        for step in range(1, MAX_COUNT + 1):
            if not cdf < u:
                break
            k += 1.0
            pmf = pmf * m
            pmf = pmf / step
            cdf = cdf + pmf
        out[j] = k
    return out


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
