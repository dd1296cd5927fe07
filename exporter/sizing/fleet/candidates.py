"""Each model's fully served candidate plans: the count vectors that carry all its demand and
that no single replica less still does. The joint program chooses one of them for every model
whose demand a stage holds all served, instead of integer counts.

Why: with integer counts the program's relaxation serves a model with fractions of replicas and
pays none of the rounding a real plan pays; a choice among whole plans pays it. Exact: a fully
served vector with a replica it can spare is matched by the vector without it (all served, no
more cost, no more GPUs of any type), so the minimal vectors include an optimum of every stage.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import LinearConstraint
from scipy.sparse import coo_array, csr_array, hstack

from exporter.sizing.fleet.values import FleetInput, Routing, Variant
from model.queueing.sizing import CEIL_SLACK

# A model whose enumeration would visit more count vectors than this keeps integer counts
# (also exact, only a looser relaxation).
MAX_VISITED = 60_000
# Candidate plans of one model at most, likewise.
MAX_CANDIDATES = 4_000


def fully_served(inp: FleetInput, model: str) -> NDArray[np.int_] | None:
    """The minimal fully served count vectors of the model's own variants (rows, in the
    order of `inp.own(model)`); None when there are too many to enumerate or none."""
    m = inp.model(model)
    own = list(inp.own(model))
    caps = np.array([v.sizing_capacity_rps(inp.untrusted_margin) for v in own])
    low = np.array([v.min_replicas for v in own])
    if m.demand_rps <= 0:
        return low[np.newaxis, :]
    # The exact rule evaluate.py reads plans back with.
    need = m.demand_rps - CEIL_SLACK * float(caps.max(initial=0.0))
    if m.routing is Routing.EVEN:
        found = _even(own, caps, low, need)
    else:
        found = _weighted(own, caps, low, need)
    if found is None or len(found) == 0 or len(found) > MAX_CANDIDATES:
        return None
    return found


def _bound(v: Variant, cap: float, need: float) -> int:
    """Replicas of v above which any fully served vector has one to spare (one more than
    carries the demand alone, against rounding)."""
    if cap <= 0:
        return v.min_replicas
    return min(v.max_replicas, max(v.min_replicas, math.ceil(need / cap) + 1))


def _weighted(
    own: list[Variant], caps: NDArray[np.float64], low: NDArray[np.int_], need: float
) -> NDArray[np.int_] | None:
    high = np.array([_bound(v, float(c), need) for v, c in zip(own, caps, strict=True)])
    serving = [i for i in range(len(own)) if caps[i] > 0]
    if not serving:
        return None
    last = max(serving, key=lambda i: high[i] - low[i])
    rest = [i for i in range(len(own)) if i != last]
    if math.prod(int(high[i] - low[i] + 1) for i in rest) > MAX_VISITED:
        return None
    axes = np.meshgrid(*(np.arange(low[i], high[i] + 1) for i in rest), indexing="ij")
    grid = np.zeros((axes[0].size if rest else 1, len(own)), dtype=np.int_)
    for i, axis in zip(rest, axes, strict=True):
        grid[:, i] = axis.ravel()
    carried = grid @ caps
    # The fewest replicas of `last` that carry the rest (corrected for the ceiling's rounding).
    n_last = np.maximum(np.ceil((need - carried) / caps[last]), low[last]).astype(np.int_)
    n_last = np.where(carried + (n_last - 1) * caps[last] >= need, n_last - 1, n_last)
    n_last = np.where(carried + n_last * caps[last] >= need, n_last, n_last + 1)
    n_last = np.maximum(n_last, low[last])
    grid[:, last] = n_last
    served = grid @ caps
    keep = (n_last <= own[last].max_replicas) & (served >= need)
    for i in rest:  # minimal: no replica of another variant to spare
        keep &= (grid[:, i] <= low[i]) | (served - caps[i] < need)
    found: NDArray[np.int_] = grid[keep]
    return found


def _even(
    own: list[Variant], caps: NDArray[np.float64], low: NDArray[np.int_], need: float
) -> NDArray[np.int_] | None:
    """Per set of variants in use, every split of the fewest replicas that carry the demand
    at the set's smallest capacity (no fewer than the set's minimums)."""
    forced = {i for i in range(len(own)) if low[i] > 0}
    rows: list[NDArray[np.int_]] = []
    visited = 0
    for size in range(1, len(own) + 1):
        for chosen in itertools.combinations(range(len(own)), size):
            used = list(chosen)
            smallest = float(caps[used].min())
            if not forced <= set(used) or smallest <= 0:
                continue
            lo = [max(int(low[i]), 1) for i in used]
            hi = [own[i].max_replicas for i in used]
            total = max(math.ceil(need / smallest), sum(lo))
            if (total - 1) * smallest >= need and total - 1 >= sum(lo):
                total -= 1  # the ceiling's rounding, either way
            if total * smallest < need:
                total += 1
            if total > sum(hi):
                continue
            visited += math.prod(h - lo_ + 1 for h, lo_ in zip(hi[:-1], lo[:-1], strict=True))
            if visited > MAX_VISITED:
                return None
            axes = np.meshgrid(
                *(np.arange(a, b + 1) for a, b in zip(lo[:-1], hi[:-1], strict=True)),
                indexing="ij",
            )
            part = np.stack([a.ravel() for a in axes], axis=1) if size > 1 else None
            block = np.zeros((1 if part is None else len(part), len(own)), dtype=np.int_)
            block[:, used[-1]] = total
            if part is not None:
                block[:, used[:-1]] = part
                block[:, used[-1]] = total - part.sum(axis=1)
            ok = (block[:, used[-1]] >= lo[-1]) & (block[:, used[-1]] <= hi[-1])
            rows.append(block[ok])
    if not rows:
        return None
    return np.concatenate(rows)


@dataclass(frozen=True, slots=True)
class Choice:
    """Binary columns, one per candidate plan of the settled models, appended after the
    program's own, and the rows tying them to the variants' counts."""

    n_columns: int
    rows: LinearConstraint  # over the program's columns followed by these

    def widen(self, row: LinearConstraint) -> LinearConstraint:
        """A row of the program over its columns and these (zero on these)."""
        matrix = csr_array(row.A)  # type: ignore[arg-type]  # a matrix, sparse or dense
        pad = csr_array((matrix.shape[0], self.n_columns))
        return LinearConstraint(hstack([matrix, pad], format="csr"), row.lb, row.ub)


def choice(inp: FleetInput, settled: set[str], width: int) -> Choice | None:
    """The candidate columns of the `settled` models (those a stage holds all served) over
    a program of `width` columns whose first are the variants' counts in input order; models
    with too many candidates keep their counts. None when no model has candidates."""
    index = {v.name: i for i, v in enumerate(inp.variants)}
    r_idx: list[NDArray[np.int_]] = []
    c_idx: list[NDArray[np.int_]] = []
    vals: list[NDArray[np.float64]] = []
    lo: list[float] = []
    hi: list[float] = []
    column = width
    for m in inp.models:
        if m.name not in settled:
            continue
        plans = fully_served(inp, m.name)
        if plans is None:
            continue
        k = len(plans)
        cols = np.arange(column, column + k)
        for local, v in enumerate(inp.own(m.name)):
            # n_v - sum_k plans[k, v] x_k = 0
            r = len(lo)
            nz = plans[:, local] != 0
            r_idx.append(np.full(1 + int(nz.sum()), r))
            c_idx.append(np.concatenate(([index[v.name]], cols[nz])))
            vals.append(np.concatenate(([1.0], -plans[nz, local].astype(float))))
            lo.append(0.0)
            hi.append(0.0)
        r = len(lo)  # sum_k x_k = 1
        r_idx.append(np.full(k, r))
        c_idx.append(cols)
        vals.append(np.ones(k))
        lo.append(1.0)
        hi.append(1.0)
        column += k
    if column == width:
        return None
    matrix = coo_array(
        (np.concatenate(vals), (np.concatenate(r_idx), np.concatenate(c_idx))),
        shape=(len(lo), column),
    ).tocsr()
    return Choice(column - width, LinearConstraint(matrix, np.array(lo), np.array(hi)))
