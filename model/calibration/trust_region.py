"""The window fit's trust-region least squares, without scipy's layers around it.

The fit ran scipy's `least_squares(method="trf")` with no bounds, unit scaling, the linear loss
and the exact (SVD) subproblem solver. Its arithmetic is a few dozen numpy operations on a
handful of residuals and three parameters, but each call went through argument checks, a
`VectorFunction` wrapping the residual and Jacobian callables, result objects and warnings
filters: about a third of a refit's CPU time in a daemon cycle (bench/daemon_scale.py profiled).
This module takes the same steps with the same floating-point operations, in the same order and
with the same LAPACK routine for the SVD, so every iterate, the evaluations asked for and the
status at the end are those scipy gives (tests/model/calibration/test_fit_fast_paths.py
compares the two bit for bit). The method: at x, with the Jacobian J = U diag(s) V^T and
residuals f, the step minimizes |J p + f| within |p| <= Delta (Levenberg-Marquardt's alpha
found by a few Newton steps on |p(alpha)| - Delta, warm-started from the last step's); the
radius shrinks to a quarter of the step when the cost fell by less than a quarter of what the
linear model predicted, and doubles when it fell by more than three quarters with the step at
the boundary; the fit stops on the cost's or the step's relative tolerance, a gradient below
`gtol`, or the evaluation limit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.linalg import LinAlgError, norm
from numpy.typing import NDArray
from scipy.linalg import lapack

FloatArray = NDArray[np.float64]

_EPS = float(np.finfo(float).eps)
_NEWTON_STEPS = 10  # at most, on |p(alpha)| = Delta per subproblem
_NEWTON_RTOL = 0.01  # |p(alpha)| within 1 % of Delta ends them


@dataclass(frozen=True, slots=True)
class TrustRegionResult:
    """Where the fit ended and why: status 0 at the evaluation limit, 1 the gradient, 2 the
    cost's tolerance, 3 the step's, 4 both (scipy's codes)."""

    x: FloatArray
    status: int
    nfev: int


def solve(
    residuals: Callable[[FloatArray], FloatArray],
    jacobian: Callable[[FloatArray], FloatArray],
    x0: FloatArray,
    *,
    ftol: float,
    xtol: float,
    gtol: float,
    max_nfev: int,
) -> TrustRegionResult:
    """Minimize 0.5 |residuals(x)|^2 from x0; `jacobian(x)` is asked where the residuals were
    last evaluated, after each accepted step (and at x0)."""
    x = np.array(x0, dtype=float)
    f = np.atleast_1d(residuals(x))
    if not np.all(np.isfinite(f)):
        raise ValueError("the window fit's residuals at its starting parameters are not finite")
    jac = np.atleast_2d(jacobian(x))
    cost = 0.5 * float(np.dot(f, f))
    grad = jac.T.dot(f)
    delta = float(norm(x))
    if delta == 0:
        delta = 1.0
    alpha = 0.0
    nfev = 1
    status: int | None = None
    rows, cols = jac.shape
    while True:
        if norm(grad, ord=np.inf) < gtol:
            status = 1
        if status is not None or nfev == max_nfev:
            break
        u, s, vt = _svd(jac)
        v = vt.T
        uf = u.T.dot(f)
        reduction = -1.0
        while reduction <= 0 and nfev < max_nfev:
            step, alpha = _subproblem(rows, cols, uf, s, v, delta, alpha)
            jstep = jac.dot(step)
            predicted = -(0.5 * float(np.dot(jstep, jstep)) + float(np.dot(step, grad)))
            x_new = x + step
            f_new = np.atleast_1d(residuals(x_new))
            nfev += 1
            step_norm = float(norm(step))
            if not np.all(np.isfinite(f_new)):
                delta = 0.25 * step_norm
                continue
            cost_new = 0.5 * float(np.dot(f_new, f_new))
            reduction = cost - cost_new
            new_delta, ratio = _radius(delta, reduction, predicted, step_norm)
            status = _converged(reduction, cost, step_norm, float(norm(x)), ratio, ftol, xtol)
            if status is not None:
                break
            alpha *= delta / new_delta
            delta = new_delta
        if reduction > 0:
            x, f, cost = x_new, f_new, cost_new
            jac = np.atleast_2d(jacobian(x))
            grad = jac.T.dot(f)
    return TrustRegionResult(x=x, status=0 if status is None else status, nfev=nfev)


def _svd(jac: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """scipy.linalg.svd(jac, full_matrices=False): the LAPACK routine it picks (gesdd) with
    the workspace it sizes, called directly (its checks and look-ups were 5 % of a daemon
    cycle at B = 256)."""
    if not np.all(np.isfinite(jac)):
        raise ValueError("the window fit's Jacobian has a non-finite entry")
    gesdd, lwork = _gesdd(*jac.shape)
    u, s, vt, info = gesdd(jac, compute_uv=True, lwork=lwork, full_matrices=False)
    if info != 0:
        raise LinAlgError(f"SVD did not converge (gesdd info {info})")
    return u, s, vt


@lru_cache(maxsize=64)
def _gesdd(rows: int, cols: int) -> tuple[Any, int]:
    """The float64 gesdd scipy.linalg.svd calls and its workspace for a rows x cols matrix
    (a window's residual count by 3)."""
    sample = np.zeros((rows, cols))
    funcs: Any = lapack.get_lapack_funcs(("gesdd", "gesdd_lwork"), (sample,), ilp64="preferred")
    gesdd, gesdd_lwork = funcs
    size: Any = lapack._compute_lwork  # type: ignore[attr-defined]  # scipy.linalg.svd sizes it so
    lwork = size(gesdd_lwork, rows, cols, compute_uv=True, full_matrices=False)
    return gesdd, int(lwork)


def _subproblem(
    rows: int, cols: int, uf: FloatArray, s: FloatArray, v: FloatArray, delta: float,
    alpha: float,
) -> tuple[FloatArray, float]:  # fmt: skip
    """The step p minimizing |J p + f| with |p| <= delta, and its Levenberg-Marquardt alpha
    (0 for the Gauss-Newton step when that fits)."""
    suf = s * uf
    full_rank = rows >= cols and s[-1] > _EPS * rows * s[0]
    if full_rank:
        newton = -v.dot(uf / s)
        if norm(newton) <= delta:
            return newton, 0.0
    upper = float(norm(suf)) / delta
    if full_rank:
        phi, slope = _phi(0.0, suf, s, delta)
        lower = -phi / slope
    else:
        lower = 0.0
    if not full_rank and alpha == 0:
        alpha = max(0.001 * upper, (lower * upper) ** 0.5)
    for _ in range(_NEWTON_STEPS):
        if alpha < lower or alpha > upper:
            alpha = max(0.001 * upper, (lower * upper) ** 0.5)
        phi, slope = _phi(alpha, suf, s, delta)
        if phi < 0:
            upper = alpha
        ratio = phi / slope
        lower = max(lower, alpha - ratio)
        alpha -= (phi + delta) * ratio / delta
        if abs(phi) < _NEWTON_RTOL * delta:
            break
    step = -v.dot(suf / (s**2 + alpha))
    step *= delta / norm(step)
    return step, alpha


def _phi(alpha: float, suf: FloatArray, s: FloatArray, delta: float) -> tuple[float, float]:
    """|p(alpha)| - delta and its derivative in alpha."""
    denom = s**2 + alpha
    size = float(norm(suf / denom))
    return size - delta, -float(np.sum(suf**2 / denom**3)) / size


def _radius(
    delta: float, reduction: float, predicted: float, step_norm: float
) -> tuple[float, float]:
    """The next radius and the ratio of the actual to the predicted cost reduction."""
    if predicted > 0:
        ratio = reduction / predicted
    elif predicted == reduction == 0:
        ratio = 1.0
    else:
        ratio = 0.0
    if ratio < 0.25:
        delta = 0.25 * step_norm
    elif ratio > 0.75 and step_norm > 0.95 * delta:
        delta *= 2.0
    return delta, ratio


def _converged(
    reduction: float, cost: float, step_norm: float, x_norm: float, ratio: float,
    ftol: float, xtol: float,
) -> int | None:  # fmt: skip
    """4 both tolerances met, 2 the cost's, 3 the step's, else None."""
    cost_met = reduction < ftol * cost and ratio > 0.25
    step_met = step_norm < xtol * (xtol + x_norm)
    if cost_met and step_met:
        return 4
    if cost_met:
        return 2
    if step_met:
        return 3
    return None
