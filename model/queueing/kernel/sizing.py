"""Compiled first-crossing search of sizing (model/queueing/sizing.py): per target, scan
[lo, end] with `points` rates, then cut the bracket holding the first rate over the target with
`refine` rates per pass until it is narrower than `rel_width` of its lower end.

The rates are np.linspace's, bit for bit, and are evaluated from the low end up to the first
one over the target only: the rates past it never change the answer, so the search returns what
evaluating every rate of each pass returned, at a fraction of the cost. The targets' first scans
cover the same rates: each is evaluated once for all of them (`crossings`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from model.queueing.kernel import chain as chain
from model.queueing.kernel import mean as mean
from model.queueing.kernel import table as kernel_table
from model.queueing.kernel.jit import compiled

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
def first_overs(
    states: FloatArray, rows: FloatArray, opts: FloatArray, metrics: NDArray[np.int64],
    targets: FloatArray, start: float, stop: float, count: int,
) -> NDArray[np.int64]:
    """Per target t: the first k with output metrics[t] over targets[t] at the rate
    linspace(start, stop, count)[k] (-1: none). One evaluation per rate serves every target;
    the scan stops once each target has crossed."""
    big_b = states.shape[2] - 1
    log_p, w = np.empty(big_b + 1), np.empty(big_b + 1)
    sol, col = np.empty(chain.CHAIN_FIELDS), np.empty(mean.FIELDS)
    over = np.full(metrics.shape[0], -1)
    left = metrics.shape[0]
    for k in range(count):
        if left == 0:
            break
        rate = linspace_at(start, stop, count, k)
        mean.rate_outputs(states, rows, 0, big_b, opts, rate, False, log_p, w, sol, col)
        for t in range(metrics.shape[0]):
            if over[t] < 0 and col[metrics[t]] > targets[t]:
                over[t] = k
                left -= 1
    return over


@compiled
def narrowed(
    states: FloatArray, rows: FloatArray, opts: FloatArray, metric: int, target: float,
    lo: float, end: float, points: int, over: int, refine: int, rel_width: float,
) -> tuple[float, bool]:
    """`first_crossing` once its first scan, of [lo, end] with `points` rates, found `over`."""
    start, stop, count = lo, end, points
    metrics, targets = np.array([metric]), np.array([target])
    while True:
        if over < 0:  # within the target over the whole bracket
            return stop, True
        if over == 0:  # missed at the bracket's low end: only possible at lo itself
            return 0.0, False
        low = linspace_at(start, stop, count, over - 1)
        high = linspace_at(start, stop, count, over)
        if high - low <= rel_width * max(low, lo):
            return low, True
        start, stop, count = low, high, refine
        over = first_overs(states, rows, opts, metrics, targets, start, stop, count)[0]


@compiled
def first_crossing(
    states: FloatArray, rows: FloatArray, opts: FloatArray, metric: int, target: float,
    lo: float, end: float, points: int, refine: int, rel_width: float,
) -> tuple[float, bool]:
    """(rate, True): the largest rate in [lo, end] (req/s) up to which output `metric` stays
    within target, to rel_width; (0.0, False) when the target is missed at lo."""
    over = first_overs(
        states, rows, opts, np.array([metric]), np.array([target]), lo, end, points
    )[0]
    return narrowed(states, rows, opts, metric, target, lo, end, points, over, refine, rel_width)


@compiled
def crossings(
    states: FloatArray, rows: FloatArray, opts: FloatArray, metrics: NDArray[np.int64],
    targets: FloatArray, lo: float, hi: float, grid: NDArray[np.int64], rel_width: float,
) -> tuple[FloatArray, NDArray[np.bool_]]:
    """Sizing's search (model/queueing/sizing.py) per target t: the largest rate in [lo, hi]
    (req/s) up to which output metrics[t] stays within targets[t], and whether it is met at
    lo. `grid` = (first scan points, refinement points, dense scan points, teeth checked).
    The first scan is shared by the targets; where the chunk count varies, the rate found is
    checked again by a dense scan below it and just below each chunk step."""
    points, refine, dense, max_teeth = grid[0], grid[1], grid[2], grid[3]
    chunks = states[:, kernel_table.CHUNKS, : states.shape[2] - 1]
    vary = chunks.max() - chunks.min() > 0
    first = first_overs(states, rows, opts, metrics, targets, lo, hi, points)
    rates, feasible = np.empty(metrics.shape[0]), np.empty(metrics.shape[0], np.bool_)
    for t in range(metrics.shape[0]):
        metric, target = metrics[t], targets[t]
        rate, ok = narrowed(states, rows, opts, metric, target, lo, hi, points, first[t],
                            refine, rel_width)  # fmt: skip
        if vary and ok and rate > lo:
            rate, ok = first_crossing(states, rows, opts, metric, target, lo, rate, dense,
                                      refine, rel_width)  # fmt: skip
            if ok and rate > lo:
                rate, _ = tooth_crossing(states, rows, opts, metric, target, lo, rate,
                                         max_teeth, rel_width)  # fmt: skip
        rates[t], feasible[t] = rate, ok
    return rates, feasible


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
