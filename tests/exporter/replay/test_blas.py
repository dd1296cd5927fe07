"""A replay runs with one BLAS thread and gives the counts back (exporter/replay/blas.py)."""

from __future__ import annotations

import numpy as np

from exporter.replay.blas import blas_thread_counts, blas_threads


def test_one_thread_inside_and_the_counts_back_after() -> None:
    np.dot(np.ones(3), np.ones(3))  # numpy's OpenBLAS is loaded
    before = blas_thread_counts()
    assert before  # the wheels' OpenBLAS is found and driven
    with blas_threads(1) as limited:
        assert limited == len(before)
        assert blas_thread_counts() == [1] * len(before)
        assert float(np.dot(np.arange(20_000.0), np.ones(20_000))) == 199_990_000.0
    assert blas_thread_counts() == before
