"""Compilation of the model's inner loops with numba, behind the Python signatures they keep.

The model is evaluated thousands of times a cycle (sizing searches, the tuner's refits): a
scalar evaluation in numpy made over a hundred calls on one-element arrays. The loops that solve
the chain and assemble the mean latencies are compiled once instead (machine code cached on
disk: NUMBA_CACHE_DIR, else next to the sources) and called with plain arrays and floats.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

import numba

_F = TypeVar("_F", bound=Callable[..., object])


def compiled(fn: _F) -> _F:
    """`fn` compiled to machine code on its first call (cached on disk); same signature.

    IEEE float semantics (a division by 0 gives inf or nan, as in numpy), no fast-math
    reassociation: the results are those of the Python expressions, operation for operation.
    """
    return cast(_F, numba.njit(cache=True, error_model="numpy", nogil=True)(fn))
