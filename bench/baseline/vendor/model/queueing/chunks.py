"""Effective prefill chunk count c(i) per batch occupancy under a token budget. Spec §3.

c(i) = min {c >= 1 : thr(c) >= i} with thr(c) = floor(max(0, (c + m)(M - n/c) / (n + m))):
the smallest c for which i requests' mean load of i (n + m)/(c + m) tokens per iteration plus
one more prefill chunk of n/c tokens fits the budget M. A mean-field count, non-decreasing in i.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from bench.baseline.vendor.model.queueing.params import ServerConfig, Workload

FloatArray = NDArray[np.float64]


def chunk_thresholds(c: FloatArray, n: FloatArray, m: FloatArray, budget: int) -> FloatArray:
    """thr(c): the largest batch whose mean token load plus one more n/c chunk fits the budget."""
    return np.floor(np.maximum(0.0, (c + m) * (budget - n / c) / (n + m)))


def chunk_counts(n: FloatArray, m: FloatArray, server: ServerConfig) -> NDArray[np.int64]:
    """c(i) for i = 1..B (last axis) for each request shape (n, m), given as (K, 1) columns.

    The closed form c(i) = max(1, ceil(c*)), with c* the positive root of
    M c^2 + (m M - n - i (n+m)) c - m n = 0, is exact up to float rounding; one correction
    step against thr(c) (strictly increasing in c) makes it equal the iterative definition.
    """
    budget = server.max_num_batched_tokens
    big_b = server.max_batch_size
    if np.all(chunk_thresholds(np.ones_like(n), n, m, budget) >= big_b):
        # The common case: the budget holds a whole prompt at every occupancy.
        return np.ones((n.shape[0], big_b), dtype=np.int64)
    i = np.arange(1, big_b + 1, dtype=np.float64)[np.newaxis, :]
    b = m * budget - n - i * (n + m)
    sqrt_d = np.sqrt(b * b + 4.0 * budget * m * n)
    # Two algebraically equal forms of the positive root; each avoids cancellation on its side.
    with np.errstate(divide="ignore", invalid="ignore"):
        root = np.where(b >= 0, 2.0 * m * n / (sqrt_d + b), (sqrt_d - b) / (2.0 * budget))
    c: FloatArray = np.maximum(1.0, np.ceil(np.nan_to_num(root, nan=0.0)))
    c = np.where(chunk_thresholds(c, n, m, budget) < i, c + 1.0, c)
    lower = np.maximum(1.0, c - 1.0)
    c = np.where((c > 1.0) & (chunk_thresholds(lower, n, m, budget) >= i), lower, c)
    return c.astype(np.int64)


def chunk_table(server: ServerConfig, workload: Workload) -> NDArray[np.int64]:
    """c(i) for batch sizes i = 1..B (element i-1): min {c >= 1 : thr(c) >= i}."""
    n = np.array([[workload.avg_input_tokens]])
    m = np.array([[workload.avg_output_tokens]])
    table: NDArray[np.int64] = chunk_counts(n, m, server)[0]
    table.flags.writeable = False
    return table
