"""Medians and percentiles of the small arrays the tuner takes every cycle, equal to numpy's
bit for bit.

`np.median` costs some 20 us a call on a handful of values (its partition, mean and NaN check
go through several layers of Python), and the tuner takes about ten a deployment a cycle. These
sort instead and average the two middle values as numpy does ((a + b) / 2), NaN wherever a NaN
is among the values, as in numpy. `np.percentile` (the load-spread tests, three a deployment a
cycle) cost about 60 us a call, 6 % of a daemon cycle at B = 256; `percentiles` interpolates
between the same order statistics with numpy's arithmetic for its default, linear method.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]


def column_medians(rows: ArrayLike) -> FloatArray:
    """np.median(rows, axis=0) of a 2-D array (NaN per column without rows)."""
    values = np.asarray(rows, dtype=np.float64)
    count = values.shape[0]
    if count == 0:
        return np.full(values.shape[1:], np.nan)
    ordered = np.sort(values, axis=0)
    half = count // 2
    if count % 2:
        out: FloatArray = ordered[half]
    else:
        with np.errstate(invalid="ignore"):  # -inf and +inf in the middle: NaN, as numpy's
            out = (ordered[half - 1] + ordered[half]) / 2
    # np.sort puts NaN last, as numpy's partition does: a NaN there makes the median NaN.
    return np.where(np.isnan(ordered[-1]), np.nan, out)


def median(values: ArrayLike) -> float:
    """float(np.median(values)) of the flattened values (NaN without any)."""
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    return float(column_medians(flat[:, np.newaxis])[0])


def percentiles(values: ArrayLike, qs: tuple[float, ...]) -> tuple[float, ...]:
    """np.percentile(values, qs) of the flattened values (q in [0, 100]; NaN when a value is
    NaN or there is none), as floats."""
    ordered = np.sort(np.asarray(values, dtype=np.float64).reshape(-1)).tolist()
    count = len(ordered)
    if count == 0 or ordered[-1] != ordered[-1]:  # np.sort puts NaN last
        return tuple(math.nan for _ in qs)
    out = []
    for q in qs:
        # numpy's linear method: the virtual index (n - 1) q / 100 between two order
        # statistics, the last one at or past the end; the interpolation from the nearer end.
        index = (count - 1) * (q / 100)
        if index >= count - 1:
            out.append(ordered[-1])
            continue
        below = math.floor(index)
        weight = index - below
        low, high = ordered[below], ordered[below + 1]
        diff = high - low
        out.append(high - diff * (1 - weight) if weight >= 0.5 else low + diff * weight)
    return tuple(out)
