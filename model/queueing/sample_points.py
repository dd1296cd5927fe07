"""Fixed quasi-random points and request-length laws for the percentile assembly.

Quantiles are read off latencies evaluated at a fixed set of points in the unit cube (a
scrambled Sobol' sequence with a fixed seed), so every call returns the same numbers and each
point's latency moves smoothly with the rate. Request lengths with mean x and coefficient of
variation cv are drawn as the uniform law on x (1 +- sqrt(3) cv) while it stays positive
(cv <= 1/sqrt(3); uniform on [x/2, 3x/2] is cv = 0.289) and as a gamma law beyond.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numpy.typing import NDArray
from scipy.special import gammaincinv, ndtri

from model.queueing import kernel_latency, kernel_samples

FloatArray = NDArray[np.float64]

POINTS = 1024  # points per metric; p99 rests on the 10 points beyond it
_SEED = 20261202
_MAX_UNIFORM_CV = 3.0**-0.5
_NORMAL_ABOVE = 40.0  # Poisson counts of larger means drawn from the Normal approximation


@lru_cache(maxsize=8)
def unit_points(dims: int, count: int = POINTS) -> FloatArray:
    """`count` points in [0, 1)^dims, shape (dims, count); the same on every call."""
    from scipy.stats import qmc  # imported on first use: scipy.stats is slow to import

    pts = qmc.Sobol(d=dims, scramble=True, seed=_SEED).random(count).T
    out: FloatArray = np.ascontiguousarray(np.clip(pts, 1e-12, 1.0 - 1e-12))
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
    itself where the variance is 0 (kernel_latency.gamma_quantile). Arrays broadcast."""
    full = [np.ascontiguousarray(v, dtype=np.float64) for v in np.broadcast_arrays(mean, var, z)]
    out: FloatArray = kernel_latency.gamma_quantiles(*(v.reshape(-1) for v in full))
    return out.reshape(full[0].shape)


def count_quantile(
    mean: FloatArray, u: FloatArray, poisson: bool | NDArray[np.bool_]
) -> FloatArray:
    """Arrivals in a window with this mean count, at level u: Poisson where `poisson`, else the
    count of a constant-rate stream in a window that starts at an arrival, floor(mean). Float
    counts."""
    shape = np.broadcast(mean, u).shape
    # Both at full shape, contiguous, for the kernel (broadcast by assignment: numpy's
    # broadcast_to costs more than the copy).
    full_mean, full_u = np.empty(shape), np.empty(shape)
    full_mean[...], full_u[...] = mean, u
    if poisson is not True and not np.any(poisson):
        return np.floor(full_mean)
    # Poisson by inverse CDF: the count is the number of k with P(K <= k) < u (at most 201, a
    # cap only reached for u within rounding of 1), counted up from 0 (compiled, one pass over
    # every element: model/queueing/kernel_samples.py). A Normal approximation for large means.
    flat_mean, flat_u = full_mean.reshape(-1), full_u.reshape(-1)
    counts: FloatArray = kernel_samples.poisson_counts(flat_mean, flat_u, _NORMAL_ABOVE)
    large = flat_mean > _NORMAL_ABOVE
    if large.any():
        counts[large] = kernel_samples.normal_counts(flat_mean[large], ndtri(flat_u[large]))
    out: FloatArray = counts.reshape(shape)
    return out if poisson is True else np.where(poisson, out, np.floor(full_mean))
