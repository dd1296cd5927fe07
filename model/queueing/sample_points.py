"""Fixed quasi-random points and request-length laws for the percentile assembly.

Quantiles are read off latencies evaluated at a fixed set of points in the unit cube (a
scrambled Sobol' sequence with a fixed seed), so every call returns the same numbers and each
point's latency moves smoothly with the rate. Request lengths with mean x and coefficient of
variation cv are drawn as the uniform law on x (1 +- sqrt(3) cv) while it stays positive
(cv <= 1/sqrt(3); uniform on [x/2, 3x/2] is cv = 0.289) and as a gamma law beyond.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from scipy.special import gammaincinv, ndtri

from model.queueing.kernel import latency as kernel_latency

FloatArray = NDArray[np.float64]

POINTS = 1024  # points per metric; p99 rests on the 10 points beyond it
_SEED = 20261202
_MAX_UNIFORM_CV = 3.0**-0.5


# The points the model uses (dims 1, 2, 4 and 10 at POINTS), as `sobol_points` makes them,
# shipped beside this module: making them needs scipy.stats, whose import took a second of a
# fresh process's start (a container's first cycle, the first `vllm-sizer plan`).
# `python -m tools.sample_points` writes the file; a test holds it to `sobol_points`.
SHIPPED_POINTS = Path(__file__).with_name("sample_points.npz")
SHIPPED_DIMS = (1, 2, 4, 10)


def sobol_points(dims: int, count: int = POINTS) -> FloatArray:
    """`count` points of the scrambled Sobol' sequence in [0, 1)^dims, shape (dims, count)."""
    from scipy.stats import qmc  # imported only here: scipy.stats is slow to import

    pts = qmc.Sobol(d=dims, scramble=True, seed=_SEED).random(count).T
    out: FloatArray = np.ascontiguousarray(np.clip(pts, 1e-12, 1.0 - 1e-12))
    return out


@lru_cache(maxsize=1)
def _shipped() -> dict[str, FloatArray]:
    try:
        with np.load(SHIPPED_POINTS) as data:
            return {key: np.ascontiguousarray(data[key], dtype=np.float64) for key in data.files}
    except OSError:  # not shipped (a source tree without it): made on first use instead
        return {}


@lru_cache(maxsize=8)
def unit_points(dims: int, count: int = POINTS) -> FloatArray:
    """`count` points in [0, 1)^dims, shape (dims, count); the same on every call."""
    shipped = _shipped().get(f"d{dims}") if count == POINTS else None
    out = shipped if shipped is not None else sobol_points(dims, count)
    out.flags.writeable = False
    return out


@lru_cache(maxsize=8)
def unit_order(dims: int, count: int = POINTS) -> NDArray[np.intp]:
    """Each row of `unit_points(dims, count)` sorted: the indices, shape (dims, count)."""
    out: NDArray[np.intp] = np.argsort(unit_points(dims, count), axis=1)
    out.flags.writeable = False
    return out


@lru_cache(maxsize=8)
def normal_points(dims: int, count: int = POINTS) -> FloatArray:
    """The standard Normal quantile of each of `unit_points(dims, count)`, same shape."""
    out: FloatArray = np.asarray(ndtri(unit_points(dims, count)), dtype=np.float64)
    out.flags.writeable = False
    return out


def length_quantile(u: FloatArray, mean: float, cv: float) -> FloatArray:
    """Token count (float) at probability level u of the length law with this mean and CV."""
    if cv == 0.0:
        return np.full_like(u, mean)
    if cv <= _MAX_UNIFORM_CV:
        half = 3.0**0.5 * cv
        out: FloatArray = mean * (1.0 - half + 2.0 * half * u)
        return out
    shape = 1.0 / (cv * cv)
    gamma = np.asarray(gammaincinv(shape, u), dtype=np.float64) * (mean / shape)
    return gamma


def gamma_quantile(mean: FloatArray, var: FloatArray, z: FloatArray) -> FloatArray:
    """Quantile at level u = Phi(z) of the gamma law with this mean and variance (Wilson-
    Hilferty's cube-root normal approximation, floored at 0; z from `normal_points`); the mean
    itself where the variance is 0 (kernel_latency.gamma_base). Arrays broadcast."""
    full = [np.ascontiguousarray(v, dtype=np.float64) for v in np.broadcast_arrays(mean, var, z)]
    base = kernel_latency.gamma_bases(*(v.reshape(-1) for v in full)).reshape(full[0].shape)
    out: FloatArray = full[0] * base**3
    return out
