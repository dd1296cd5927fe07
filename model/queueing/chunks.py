"""Effective prefill chunk count c(i) per batch occupancy under a token budget. Spec §3.

c(i) = min {c >= 1 : thr(c) >= i} with thr(c) = floor(max(0, (c + m)(M - n/c) / (n + m))):
the smallest c for which i requests' mean load of i (n + m)/(c + m) tokens per iteration plus
one more prefill chunk of n/c tokens fits the budget M. A mean-field count, non-decreasing in i.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from model.queueing.kernel import table as kernel_table
from model.queueing.params import ServerConfig, Workload

FloatArray = NDArray[np.float64]


def chunk_counts(n: FloatArray, m: FloatArray, server: ServerConfig) -> NDArray[np.int64]:
    """c(i) for i = 1..B (last axis) for each request shape (n, m), given as (K, 1) columns
    (model/queueing/kernel/table.py)."""
    n_flat = np.ascontiguousarray(n, dtype=np.float64).reshape(-1)
    m_flat = np.ascontiguousarray(m, dtype=np.float64).reshape(-1)
    out = np.empty((n_flat.shape[0], server.max_batch_size))
    kernel_table.fill_chunks(
        n_flat, m_flat, float(server.max_num_batched_tokens), server.max_batch_size, out
    )
    return out.astype(np.int64)


def chunk_table(server: ServerConfig, workload: Workload) -> NDArray[np.int64]:
    """c(i) for batch sizes i = 1..B (element i-1): min {c >= 1 : thr(c) >= i}."""
    n = np.array([[workload.avg_input_tokens]])
    m = np.array([[workload.avg_output_tokens]])
    table: NDArray[np.int64] = chunk_counts(n, m, server)[0]
    table.flags.writeable = False
    return table
