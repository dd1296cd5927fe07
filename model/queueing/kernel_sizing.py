"""Compiled first-crossing search of sizing (model/queueing/sizing.py): per target, scan
[lo, end] with `points` rates, then cut the bracket holding the first rate over the target with
`refine` rates per pass until it is narrower than `rel_width` of its lower end.

The rates are np.linspace's, bit for bit, and are evaluated from the low end up to the first
one over the target only: the rates past it never change the answer, so the search returns what
evaluating every rate of each pass returned, at a fraction of the cost.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from model.queueing import kernel_chain as chain
from model.queueing import kernel_mean as mean
from model.queueing.jit import compiled

FloatArray = NDArray[np.float64]


@compiled
def linspace_at(start: float, stop: float, count: int, k: int) -> float:
    """np.linspace(start, stop, count)[k] (count >= 2), computed the way numpy does."""
    if k == count - 1:
        return stop
    div = count - 1
    delta = stop - start
    step = delta / div
    if step == 0.0:  # numpy's path for subnormal steps
        return float(k) / div * delta + start
    return float(k) * step + start


@compiled
def first_crossing(
    states: FloatArray, rows: FloatArray, opts: FloatArray, metric: int, target: float,
    lo: float, end: float, points: int, refine: int, rel_width: float,
) -> tuple[float, bool]:
    """(rate, True): the largest rate in [lo, end] (req/s) up to which output `metric` stays
    within target, to rel_width; (0.0, False) when the target is missed at lo."""
    big_b = states.shape[2] - 1
    log_p, w = np.empty(big_b + 1), np.empty(big_b + 1)
    sol, col = np.empty(chain.CHAIN_FIELDS), np.empty(mean.FIELDS)
    start, stop, count = lo, end, points
    while True:
        over = -1
        for k in range(count):
            rate = linspace_at(start, stop, count, k)
            mean.rate_outputs(states, rows, 0, big_b, opts, rate, False, log_p, w, sol, col)
            if col[metric] > target:
                over = k
                break
        if over < 0:  # within the target over the whole bracket
            return stop, True
        if over == 0:  # missed at the bracket's low end: only possible at lo itself
            return 0.0, False
        low = linspace_at(start, stop, count, over - 1)
        high = linspace_at(start, stop, count, over)
        if high - low <= rel_width * max(low, lo):
            return low, True
        start, stop, count = low, high, refine


@compiled
def _metric_and_chunks(
    states: FloatArray, rows: FloatArray, opts: FloatArray, metric: int, rate: float,
    log_p: FloatArray, w: FloatArray, sol: FloatArray, col: FloatArray,
) -> tuple[float, float]:
    mean.rate_outputs(states, rows, 0, states.shape[2] - 1, opts, rate, False, log_p, w, sol, col)
    return col[metric], col[mean.CHUNK_COUNT]


@compiled
def tooth_crossing(
    states: FloatArray, rows: FloatArray, opts: FloatArray, metric: int, target: float,
    lo: float, end: float, max_teeth: int, rel_width: float,
) -> tuple[float, bool]:
    """The first crossing below `end` (req/s) at a chunk-count step ("tooth") that a grid can
    miss: ITL falls where the chunk count steps up, so an excursion over the target can sit in
    a sliver just below a step. Each step between lo and end is located by bisection (the chunk
    count grows with the rate) and the metric read just below it; at the first step where it is
    over, the crossing is searched on the segment that ends there. (end, True) when no step
    shows an excursion, or when there are more than max_teeth steps (not checked)."""
    big_b = states.shape[2] - 1
    log_p, w = np.empty(big_b + 1), np.empty(big_b + 1)
    sol, col = np.empty(chain.CHAIN_FIELDS), np.empty(mean.FIELDS)
    _, c_lo = _metric_and_chunks(states, rows, opts, metric, lo, log_p, w, sol, col)
    _, c_end = _metric_and_chunks(states, rows, opts, metric, end, log_p, w, sol, col)
    if c_end - c_lo > max_teeth:
        return end, True
    seg_lo, last_within = lo, lo
    chunks = c_lo
    while chunks < c_end:
        # The largest rate whose chunk count is still `chunks` (to 1e-13 relative).
        below, above = seg_lo, end
        value = 0.0
        while above - below > 1e-13 * above:
            mid = 0.5 * (below + above)
            v, c = _metric_and_chunks(states, rows, opts, metric, mid, log_p, w, sol, col)
            if c <= chunks:
                below, value = mid, v
            else:
                above = mid
        if below > seg_lo and value > target:
            rate, feasible = first_crossing(
                states, rows, opts, metric, target, seg_lo, below, 48, 32, rel_width
            )
            # Over already where the step lands: the crossing is the step itself.
            return (rate, True) if feasible else (last_within, True)
        _, chunks = _metric_and_chunks(states, rows, opts, metric, above, log_p, w, sol, col)
        seg_lo, last_within = above, below
    return end, True
