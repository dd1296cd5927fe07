"""The emulated vLLM histograms' bucket counting compiled (issue 45): a replay window's
inter-token gaps, thousands per replica, counted into vLLM's `le` buckets in one pass."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from model.queueing.kernel.jit import compiled

FloatArray = NDArray[np.float64]


@compiled
def bucket_add(bounds: FloatArray, values: FloatArray, weights: FloatArray,
               counts: FloatArray) -> None:
    """Each value's weight (1 when `weights` is empty) added to the count of the first bound
    >= it (the last count past every bound, NaN included): numpy's searchsorted (side left)
    and bincount, in one pass over a window's values instead of a binary search each. The
    counts are whole numbers, so the order of the additions changes nothing."""
    n = bounds.size
    for j in range(values.size):
        v = values[j]
        i = 0
        while i < n and not v <= bounds[i]:
            i += 1
        counts[i] += weights[j] if weights.size else 1.0
