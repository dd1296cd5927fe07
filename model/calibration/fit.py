"""Joint fit of (alpha, beta, gamma) to observed TTFT and ITL. Tuner spec §3, §4, §5, §10.

Loss (spec §3): sum over observations of weight x (((TTFT_pred - TTFT) / TTFT)^2 +
((ITL_pred - ITL) / ITL)^2). Deviations from the reference tuner (llm-inferno model-tuner),
each one the tuner spec recommends or a speed choice:
- the parameters are fitted in log space (positivity for free, commensurate scales; the
  reference's scaling theta = p x0 by the start becomes a shift) by a trust-region least-squares
  method on the residual vector, which needs a few dozen model evaluations where Nelder-Mead
  needs hundreds; Nelder-Mead with the reference settings (adaptive coefficients, 5 % relative
  initial simplex, at most 500 evaluations) stays available as `FitMethod.NELDER_MEAD`;
- residuals come from `residuals.py`: one compiled model call per max_batch_size for all
  observations (and for all the parameter vectors of a finite-difference Jacobian), and a
  finite penalty growing with the overload for a saturated point;
- the start is the light-traffic guess (`initial_guess`) on the lowest-rate observation (the one
  closest to light traffic), scaled down until every observation is below 0.9 of saturation;
- identifiability is judged per parameter, from the design alone like the reference's
  condition-number test: at 5 % relative noise on every TTFT and ITL, the standard error of
  log(theta_k), sqrt(diag((J^T J)^-1)) with J the central-difference Jacobian (step 1e-3 in
  log-parameters), must be at most 0.15. A model misfit does not make a parameter unidentified;
  it shows in `std_errors`, which use the residual spread left (floored at 5 %). The reference's
  single condition number sigma_max / sigma_min of J stays available as a property;
- optionally (the live tuner) a weak Gaussian prior on log(theta) (`model.calibration.prior`):
  residuals (noise_level / sigma_k) (log theta_k - log centre_k) join the vector, so the loss is
  a MAP objective at the nominal noise and a direction the points do not pin stays at the
  centre instead of running to a limit; identifiability is still judged on the points alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import minimize

from model.calibration import trust_region
from model.calibration.medians import median
from model.calibration.observation import Observation
from model.calibration.prior import Prior
from model.calibration.residuals import (
    LOG_LOWER,
    LOG_UPPER,
    FitProblem,
    PenalizedProblem,
    params_from_log,
)
from model.queueing.params import ServerConfig, ServiceParams
from model.queueing.validation import require_int_at_least, require_positive
from model.queueing.variant import DEFAULT_MODEL, ModelOptions

FloatArray = NDArray[np.float64]

# The reference config's initState (spec §13): the seed whose gamma the light-traffic guess pins.
DEFAULT_SEED = ServiceParams(5.0, 0.05, 5e-5)
# The reference's start when no guess exists (gamma 10x the seed's; spec §4.3), kept for parity.
FALLBACK_START = ServiceParams(5.0, 0.05, 5e-4)
LEGACY_BASE_FACTOR = 0.9  # guess without a seed: alpha = 0.9 ITL (spec §4.2)
DEFAULT_MAX_NFEV = 100  # trust-region steps; Nelder-Mead gets 5 loss evaluations per step
NELDER_MEAD_MAX_FEV = 500  # the reference's cap on loss evaluations (spec §5.5)
NELDER_MEAD_STEP = math.log(1.05)  # spec §5.2: a 5 % relative simplex offset, in log space
DEFAULT_NOISE_LEVEL = 0.05  # relative measurement noise of TTFT and ITL the test assumes
DEFAULT_MAX_STD_ERROR = 0.15  # identified: log(theta) known to +-0.15 (one standard error)
DIFF_STEP = 1e-3  # trust-region forward differences: wide enough to step over chunk-count jumps
TOLERANCE = 1e-6  # ftol and xtol of the trust-region method (log-parameter space)
START_MAX_LOAD = 0.9  # the start is scaled so every observation is below this load


class FitMethod(StrEnum):
    """Optimizer of the fit."""

    TRUST_REGION = "trust_region"  # scipy least_squares "trf" steps on the residual vector
    NELDER_MEAD = "nelder_mead"  # the reference's optimizer and settings (spec §5)


class FitStatus(StrEnum):
    """How the fit ended; values are exported label values."""

    CONVERGED = "converged"
    EVALUATION_LIMIT = "evaluation_limit"
    UNSTABLE = "unstable"


FIT_MESSAGES: Mapping[FitStatus, str] = MappingProxyType(
    {
        FitStatus.CONVERGED: "the optimizer converged",
        FitStatus.EVALUATION_LIMIT: "the optimizer stopped at its evaluation limit",
        FitStatus.UNSTABLE: "an observation is at or above the fitted saturation rate",
    }
)


@dataclass(frozen=True, slots=True)
class MetricError:
    """Fit error of one latency metric, as fractions: mean |pred - meas| / mean meas (paper
    Table I) and the median of |pred - meas| / meas."""

    mean_ratio: float
    median_ratio: float


@dataclass(frozen=True, slots=True, kw_only=True)
class FitResult:
    """Fitted parameters (ms) with errors and identifiability diagnostics. Spec §3, §10.

    `residuals` has one row per observation: relative TTFT and ITL errors (pred - meas) / meas,
    unweighted, inf where the point is unstable. `singular_values` are those of the Jacobian of
    the weighted relative residuals with respect to log-parameters; `std_errors` are the
    standard errors of log(alpha), log(beta), log(gamma) (about the relative errors) at the
    residual spread left; `identified` is one flag per parameter: the points pin it at the
    nominal noise level. `nfev` counts model evaluations (each one evaluates every
    observation), including those for Jacobians.
    """

    success: bool
    status: FitStatus
    message: str
    params: ServiceParams
    loss: float
    nfev: int
    residuals: FloatArray
    ttft_error: MetricError
    itl_error: MetricError
    singular_values: FloatArray
    identified: tuple[bool, bool, bool]
    std_errors: tuple[float, float, float]

    @property
    def condition_number(self) -> float:
        """sigma_max / sigma_min of the scaled Jacobian (inf when singular). Spec §10.1."""
        low = float(self.singular_values[-1])
        return float(self.singular_values[0]) / low if low > 0 else math.inf

    @property
    def all_identified(self) -> bool:
        """True when every parameter is identified by the observations."""
        return all(self.identified)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe mapping; non-finite numbers become None."""
        return {
            "success": self.success,
            "status": self.status.value,
            "message": self.message,
            "params": self.params.to_dict(),
            "loss": _finite_or_none(self.loss),
            "nfev": self.nfev,
            "residuals": [[_finite_or_none(v) for v in row] for row in self.residuals.tolist()],
            "ttft_error": [
                _finite_or_none(self.ttft_error.mean_ratio),
                _finite_or_none(self.ttft_error.median_ratio),
            ],
            "itl_error": [
                _finite_or_none(self.itl_error.mean_ratio),
                _finite_or_none(self.itl_error.median_ratio),
            ],
            "singular_values": self.singular_values.tolist(),
            "identified": list(self.identified),
            "std_errors": [_finite_or_none(v) for v in self.std_errors],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FitResult:
        """Inverse of to_dict (None reads back as inf)."""
        try:
            status = FitStatus(data["status"])
            residuals = np.array(
                [[_none_to_inf(v) for v in row] for row in data["residuals"]], dtype=np.float64
            ).reshape(-1, 2)
            singular = np.array(data["singular_values"], dtype=np.float64)
            ttft, itl = data["ttft_error"], data["itl_error"]
            identified = tuple(bool(v) for v in data["identified"])
            std_errors = tuple(_none_to_inf(v) for v in data["std_errors"])
            if len(identified) != 3 or len(std_errors) != 3:
                raise ValueError(f"`fit_result` must have 3 identified flags, got {identified}")
            result = cls(
                success=bool(data["success"]),
                status=status,
                message=str(data["message"]),
                params=ServiceParams.from_dict(data["params"]),
                loss=_none_to_inf(data["loss"]),
                nfev=int(data["nfev"]),
                residuals=_read_only(residuals),
                ttft_error=MetricError(_none_to_inf(ttft[0]), _none_to_inf(ttft[1])),
                itl_error=MetricError(_none_to_inf(itl[0]), _none_to_inf(itl[1])),
                singular_values=_read_only(singular),
                identified=identified,
                std_errors=std_errors,
            )
        except (KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"`fit_result` is malformed: {exc!r}") from exc
        return result


def initial_guess(
    observation: Observation, seed: ServiceParams | None = DEFAULT_SEED
) -> ServiceParams | None:
    """Light-traffic start from one observation (ms), or None when the legacy path fails.

    Spec §4: with a seed, pin gamma to it and solve TTFT0 = alpha + (beta + gamma) n and
    ITL0 = alpha + beta + gamma (n + (m + 1) / 2) for alpha and beta, falling back to the whole
    seed when n <= 1 or either comes out <= 0; without one (the legacy path), take
    alpha = 0.9 ITL, beta + gamma = (TTFT - alpha) / n and gamma from the ITL equation.
    """
    t, i = observation.ttft_ms, observation.itl_ms
    n, m = observation.avg_input_tokens, observation.avg_output_tokens
    if seed is not None:
        gamma = seed.gamma_ms
        if n > 1:
            beta = (t - i + gamma * (m + 1.0) / 2.0) / (n - 1.0)
            alpha = i - beta - gamma * (n + (m + 1.0) / 2.0)
            if alpha > 0 and beta > 0:
                return ServiceParams(alpha, beta, gamma)
        return seed
    alpha = LEGACY_BASE_FACTOR * i
    both = (t - alpha) / n  # beta + gamma
    span = n + (m + 1.0) / 2.0 - 1.0
    if both < 0 or span <= 0:
        return None
    gamma = ((i - alpha) - both) / span
    beta = both - gamma
    if alpha > 0 and beta > 0 and gamma > 0:
        return ServiceParams(alpha, beta, gamma)
    return None


def fit(
    observations: Sequence[Observation],
    server: ServerConfig,
    start: ServiceParams | None = None,
    *,
    options: ModelOptions = DEFAULT_MODEL,
    method: FitMethod = FitMethod.TRUST_REGION,
    max_nfev: int = DEFAULT_MAX_NFEV,
    noise_level: float = DEFAULT_NOISE_LEVEL,
    max_std_error: float = DEFAULT_MAX_STD_ERROR,
    prior: Prior | None = None,
    itl_only: bool = False,
) -> FitResult:
    """Fit (alpha, beta, gamma) in ms to the observations' TTFT and ITL (ITL alone with
    `itl_only`: the loss, the identifiability test and the error spread leave TTFT out; the
    result still reports both metrics' errors). Spec §3-§5, §10.

    Without `start`, the light-traffic guess (`initial_guess`) on the lowest-rate observation,
    or FALLBACK_START when it fails, is used. `prior` adds the MAP penalty (module docstring);
    `loss` and the error figures stay those of the points.
    `max_nfev` caps the optimizer's own residual evaluations (trust region; Jacobian ones not
    counted) or 5 x that many loss evaluations, at most 500 (Nelder-Mead); reaching the cap is
    status "evaluation_limit" (success False). `noise_level` and `max_std_error` set the
    identifiability test (module docstring).
    """
    problem = FitProblem(observations, server, options, itl_only=itl_only)
    if start is not None and not isinstance(start, ServiceParams):
        raise ValueError(f"`start` must be a ServiceParams or None, got {start!r}")
    try:
        method = FitMethod(method)
    except ValueError as exc:
        allowed = ", ".join(repr(v.value) for v in FitMethod)
        raise ValueError(f"`method` must be one of {allowed}, got {method!r}") from exc
    max_nfev = require_int_at_least("max_nfev", max_nfev, 1)
    noise_level = require_positive("noise_level", noise_level)
    max_std_error = require_positive("max_std_error", max_std_error)
    if prior is not None and not isinstance(prior, Prior):
        raise ValueError(f"`prior` must be a Prior or None, got {prior!r}")
    objective = PenalizedProblem(problem, prior, noise_level, rel_step=DIFF_STEP)

    x0 = _stable_start(problem, start if start is not None else _default_start(observations))
    if method is FitMethod.TRUST_REGION:
        x, limited = _trust_region(objective, x0, max_nfev)
    else:
        x, limited = _nelder_mead(objective, x0, max_nfev)
    return _result(problem, x, limited, noise_level, max_std_error)


def _default_start(observations: Sequence[Observation]) -> ServiceParams:
    lightest = min(observations, key=lambda o: o.rate_rps)
    return initial_guess(lightest) or FALLBACK_START


def _stable_start(problem: FitProblem, start: ServiceParams) -> FloatArray:
    """log(start), scaled down so that no observation is overloaded: the iteration time is
    homogeneous of degree 1 in (alpha, beta, gamma), so scaling all three by f scales every
    saturation rate by 1 / f."""
    x: FloatArray = np.clip(np.log(np.array(start.as_tuple())), LOG_LOWER, LOG_UPPER)
    for _ in range(3):  # one pass is exact for the paper variant; others may need another
        _, load = problem.relative_errors(params_from_log(x))
        worst = float(np.max(load))
        if worst <= START_MAX_LOAD:
            break
        x = np.clip(x + math.log(START_MAX_LOAD / worst), LOG_LOWER, LOG_UPPER)
    return x


def _trust_region(
    objective: PenalizedProblem, x0: FloatArray, max_nfev: int
) -> tuple[FloatArray, bool]:
    # scipy's least_squares "trf" steps (model/calibration/trust_region.py), with its
    # forward differences at DIFF_STEP, the three columns in one model call
    # (PenalizedProblem.forward_jacobian).
    out = trust_region.solve(
        objective.residuals,
        objective.forward_jacobian,
        x0,
        ftol=TOLERANCE,
        xtol=TOLERANCE,
        gtol=1e-8,
        max_nfev=max_nfev,
    )
    return np.clip(out.x, LOG_LOWER, LOG_UPPER), out.status == 0


def _nelder_mead(
    objective: PenalizedProblem, x0: FloatArray, max_nfev: int
) -> tuple[FloatArray, bool]:
    def loss(x: FloatArray) -> float:
        return float(np.sum(objective.residuals(x) ** 2))

    simplex = np.vstack([x0, x0 + NELDER_MEAD_STEP * np.eye(3)])
    out = minimize(
        loss,
        x0,
        method="Nelder-Mead",
        options={
            # Gao-Han coefficients for 3 parameters: reflect 1, expand 5/3, contract 7/12,
            # shrink 2/3 (spec §5.3).
            "adaptive": True,
            "initial_simplex": simplex,
            "maxfev": min(NELDER_MEAD_MAX_FEV, 5 * max_nfev),
            "xatol": 1e-10,
            "fatol": 1e-10,
        },
    )
    return np.clip(out.x, LOG_LOWER, LOG_UPPER), out.status == 1


def _result(
    problem: FitProblem, x: FloatArray, limited: bool, noise_level: float, max_std_error: float
) -> FitResult:
    params = params_from_log(x)
    errors, load = problem.relative_errors(params)
    unstable = not bool(np.all(np.isfinite(errors)))
    weighted = (errors * problem.sqrt_weight[:, np.newaxis])[:, problem.metrics]
    loss = float(np.sum(weighted**2))
    jac = problem.jacobian(x)
    if jac.shape[0] < 3:  # one observation: pad so the null direction shows as sigma = 0
        jac = np.vstack([jac, np.zeros((3 - jac.shape[0], 3))])
    singular, unit = _unit_std_errors(jac)
    # Identified is a property of the design: the points pin the parameter at the nominal
    # noise. The reported errors use the spread actually left (model misfit included).
    identified = (
        bool(noise_level * unit[0] <= max_std_error),
        bool(noise_level * unit[1] <= max_std_error),
        bool(noise_level * unit[2] <= max_std_error),
    )
    finite = weighted[np.isfinite(weighted)]
    spread = max(noise_level, math.sqrt(float(np.sum(finite**2)) / max(weighted.size - 3, 1)))
    std_errors = (spread * unit[0], spread * unit[1], spread * unit[2])
    status = (
        FitStatus.UNSTABLE
        if unstable
        else FitStatus.EVALUATION_LIMIT
        if limited
        else FitStatus.CONVERGED
    )
    return FitResult(
        success=status is FitStatus.CONVERGED,
        status=status,
        message=FIT_MESSAGES[status],
        params=params,
        loss=loss,
        nfev=problem.evaluations,
        residuals=_read_only(errors),
        ttft_error=_metric_error(problem.ttft_ms, errors[:, 0]),
        itl_error=_metric_error(problem.itl_ms, errors[:, 1]),
        singular_values=_read_only(singular),
        identified=identified,
        std_errors=std_errors,
    )


def _unit_std_errors(jac: FloatArray) -> tuple[FloatArray, tuple[float, float, float]]:
    """Singular values of J and sqrt(diag((J^T J)^-1)): the standard errors of the
    log-parameters per unit of relative residual noise."""
    if not np.all(np.isfinite(jac)):
        return np.zeros(3), (math.inf, math.inf, math.inf)
    _, singular, vt = np.linalg.svd(jac, full_matrices=False)
    if singular[0] <= 0:
        return singular, (math.inf, math.inf, math.inf)
    # A singular direction stays huge instead of dividing by zero.
    safe = np.maximum(singular, singular[0] * 1e-15)
    unit = np.sqrt(((vt.T / safe) ** 2).sum(axis=1))
    return singular, (float(unit[0]), float(unit[1]), float(unit[2]))


def _metric_error(measured: FloatArray, relative: FloatArray) -> MetricError:
    absolute = np.abs(relative) * measured
    return MetricError(
        mean_ratio=float(np.mean(absolute) / np.mean(measured)),
        median_ratio=median(np.abs(relative)),
    )


def _read_only(arr: FloatArray) -> FloatArray:
    arr = np.array(arr, dtype=np.float64)
    arr.flags.writeable = False
    return arr


def _finite_or_none(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _none_to_inf(value: float | None) -> float:
    return math.inf if value is None else float(value)
