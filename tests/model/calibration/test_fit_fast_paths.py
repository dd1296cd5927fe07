"""The window fit's faster paths give what the slower ones they replaced gave, bit for bit:
the Jacobian the trust-region fit builds itself (scipy's '2-point' forward differences with
`diff_step`, without scipy's wrappers), the trust-region steps taken without scipy's
`least_squares` around them, the medians of small arrays, and the model evaluation a fit asks
twice in a row."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.optimize import least_squares

from model import ServerConfig, ServiceParams
from model.calibration.fit import DIFF_STEP, TOLERANCE, _stable_start, _trust_region
from model.calibration.medians import column_medians, median, percentiles
from model.calibration.prior import GENERIC_PRIOR
from model.calibration.residuals import (
    LOG_LOWER,
    LOG_UPPER,
    UNSTABLE_RESIDUAL,
    FitProblem,
    PenalizedProblem,
)
from tests.model.calibration.synthetic import LOADS, SHAPES, observations

TRUTH = ServiceParams(6.68, 2.01e-2, 5.52e-5)


def _problem(seed: int, batch: int, with_prior: bool) -> tuple[PenalizedProblem, np.ndarray]:
    server = ServerConfig(max_batch_size=batch)
    points = [(n, m, load) for n, m in SHAPES[: 2 + seed % 3] for load in LOADS]
    obs = observations(TRUTH, server, points, np.random.default_rng(seed), noise=0.05)
    problem = FitProblem(obs, server)
    objective = PenalizedProblem(problem, GENERIC_PRIOR if with_prior else None, 0.05,
                                 rel_step=DIFF_STEP)  # fmt: skip
    start = ServiceParams(5.0 + seed, 0.05, 5e-5 * (1 + seed % 4))
    return objective, _stable_start(problem, start)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("batch", [64, 256])
def test_the_fit_takes_the_steps_scipy_takes_with_its_own_differences(
    seed: int, batch: int
) -> None:
    objective, x0 = _problem(seed, batch, with_prior=seed % 2 == 0)
    ours, _ = _trust_region(objective, x0, 100)
    theirs = least_squares(
        objective.residuals, x0, method="trf", diff_step=DIFF_STEP,  # type: ignore[arg-type]
        ftol=TOLERANCE, xtol=TOLERANCE, gtol=1e-8, max_nfev=100,
    )  # fmt: skip
    assert np.array_equal(ours, np.clip(theirs.x, LOG_LOWER, LOG_UPPER))
    assert not np.array_equal(ours, x0)  # the fit moved: the comparison has teeth


def _scipy_fit(
    objective: PenalizedProblem, x0: np.ndarray, max_nfev: int
) -> tuple[np.ndarray, bool]:
    out = least_squares(
        objective.residuals, x0, jac=objective.forward_jacobian, method="trf",
        ftol=TOLERANCE, xtol=TOLERANCE, gtol=1e-8, max_nfev=max_nfev,
    )  # fmt: skip
    return np.clip(out.x, LOG_LOWER, LOG_UPPER), out.status == 0


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("batch", [32, 256, 4096])
@pytest.mark.parametrize("max_nfev", [3, 100])
def test_the_fit_steps_as_scipys_least_squares_with_the_same_evaluations(
    seed: int, batch: int, max_nfev: int
) -> None:
    rng = np.random.default_rng(100 + seed)
    server = ServerConfig(max_batch_size=batch)
    shapes = [SHAPES[k] for k in rng.permutation(len(SHAPES))[: 1 + seed % 4]]
    points = [(n, m, load) for n, m in shapes for load in LOADS[: 1 + seed % 3]]
    obs = observations(TRUTH, server, points, rng, noise=0.02 + 0.1 * (seed % 3))
    # Starts near and far from the truth, some overloading points (the penalty's branch).
    factor = np.exp(rng.normal(0.0, 1.5, 3))
    start = ServiceParams(*(np.array(TRUTH.as_tuple()) * factor))
    results = []
    for ours in (True, False):
        problem = FitProblem(obs, server, itl_only=seed % 5 == 4)
        objective = PenalizedProblem(problem, GENERIC_PRIOR if seed % 2 else None, 0.05,
                                     rel_step=DIFF_STEP)  # fmt: skip
        x0 = np.log(np.array(start.as_tuple())) if seed % 3 == 0 else _stable_start(problem, start)
        found = (_trust_region if ours else _scipy_fit)(objective, x0, max_nfev)
        results.append((found[0], found[1], problem.evaluations))
    (x, limited, evaluations), (x_scipy, limited_scipy, evaluations_scipy) = results
    assert np.array_equal(x, x_scipy)
    assert limited == limited_scipy and evaluations == evaluations_scipy
    assert limited == (max_nfev == 3)  # both ends reached: the cap and convergence


def _numpy_residuals(problem: FitProblem, theta: np.ndarray) -> np.ndarray:
    """The residuals as the numpy assembly gives them, from the model's predictions."""
    ttft, itl, sat = problem.predict_many(theta)
    errors = np.stack(
        [(ttft - problem.ttft_ms) / problem.ttft_ms, (itl - problem.itl_ms) / problem.itl_ms], 2
    )
    penalty = UNSTABLE_RESIDUAL * (problem.rate_rps / sat)[:, :, np.newaxis]
    errors = np.where(np.isfinite(errors), errors, penalty)
    weighted = (errors * problem.sqrt_weight[:, np.newaxis])[:, :, problem.metrics]
    flat: np.ndarray = weighted.transpose(0, 2, 1).reshape(theta.shape[0], -1)
    return flat


@pytest.mark.parametrize("seed", range(8))
def test_the_compiled_residuals_are_the_numpy_assemblys(seed: int) -> None:
    rng = np.random.default_rng(300 + seed)
    server = ServerConfig(max_batch_size=[16, 256, 4096][seed % 3])
    points = [(n, m, load) for n, m in SHAPES[: 1 + seed % 4] for load in LOADS]
    obs = observations(TRUTH, server, points, rng, noise=0.05)
    weights = rng.uniform(0.2, 3.0, len(obs))
    obs = [replace(o, weight=float(w)) for o, w in zip(obs, weights, strict=True)]
    problem = FitProblem(obs, server, itl_only=seed % 2 == 1)
    assert len(problem.groups) == 1  # the compiled path
    # Around the truth and up to 4x slower parameters: some points overloaded (the penalty).
    xs = [np.log(np.array(TRUTH.as_tuple())) + rng.normal(0.0, 0.5, 3) for _ in range(4)]
    xs.append(np.log(np.array(TRUTH.as_tuple()) * 4.0))
    theta = np.exp(np.clip(np.array(xs), LOG_LOWER, LOG_UPPER))
    found = np.array(problem.residuals_many(xs))
    assert np.array_equal(found, _numpy_residuals(problem, theta))
    assert np.any(found >= UNSTABLE_RESIDUAL * 0.5)  # a penalty among them
    before = problem.evaluations
    one = problem.residuals_many([xs[0]])[0]  # compiled, then kept
    again = problem.residuals_many([xs[0].copy()])[0]  # served from what was kept
    assert np.array_equal(one, found[0]) and np.array_equal(again, found[0])
    assert problem.evaluations == before + 2


def test_the_jacobian_is_evaluated_where_asked_when_the_residuals_there_are_not_at_hand() -> None:
    objective, x0 = _problem(1, 64, with_prior=True)
    here = objective.forward_jacobian(x0)  # nothing evaluated yet
    objective.residuals(x0 + 0.1)
    again = objective.forward_jacobian(x0)  # the last residuals are elsewhere
    assert np.array_equal(here, again)
    assert here.shape == (objective.residuals(x0).size, 3) and np.all(np.isfinite(here))


_VALUES = st.one_of(
    st.floats(min_value=-1e12, max_value=1e12, allow_nan=False),
    st.sampled_from([np.nan, np.inf, -np.inf, 0.0, 1.0]),
)


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float64, st.tuples(st.integers(1, 25), st.integers(1, 3)), elements=_VALUES))
def test_column_medians_are_numpys(rows: np.ndarray) -> None:
    with np.errstate(invalid="ignore"):  # numpy warns where -inf and +inf meet in the middle
        expected, first = np.median(rows, axis=0), np.median(rows[:, 0])
    assert np.array_equal(column_medians(rows), expected, equal_nan=True)
    assert np.array_equal(median(rows[:, 0]), first, equal_nan=True)


_POSITIVE = st.floats(min_value=1e-300, max_value=1e300, allow_nan=False, allow_infinity=False)


@settings(max_examples=500, deadline=None)
@given(
    hnp.arrays(np.float64, st.integers(1, 40), elements=_POSITIVE | st.sampled_from([1.0, 2.5])),
    st.lists(st.floats(min_value=0.0, max_value=100.0), min_size=1, max_size=4),
)
def test_percentiles_are_numpys(values: np.ndarray, qs: list[float]) -> None:
    expected = np.percentile(values, qs)
    assert np.array_equal(np.array(percentiles(values, tuple(qs))), expected)


def test_percentiles_of_the_spread_test_and_of_nothing() -> None:
    rates = np.array([3.1, 0.7, 2.2, 9.4, 5.05, 1.9])
    assert percentiles(rates, (20.0, 80.0)) == tuple(np.percentile(rates, (20.0, 80.0)))
    assert percentiles(rates, (0.0, 100.0)) == (0.7, 9.4)
    assert all(np.isnan(v) for v in percentiles(np.empty(0), (20.0, 80.0)))
    assert all(np.isnan(v) for v in percentiles(np.array([1.0, np.nan]), (50.0,)))


def test_medians_of_nothing_are_nan() -> None:
    assert np.isnan(column_medians(np.empty((0, 2)))).all()


def test_a_repeated_evaluation_is_served_again_and_counted() -> None:
    objective, x0 = _problem(2, 64, with_prior=False)
    problem = objective.problem
    theta = np.exp(x0)[np.newaxis, :] * 1.5
    before = problem.evaluations
    first = problem.predict_many(theta)
    again = problem.predict_many(theta.copy())
    assert all(a is b for a, b in zip(first, again, strict=True))
    assert problem.evaluations == before + 2
    assert not first[0].flags.writeable  # shared: no caller may change it
    other = problem.predict_many(theta * 1.01)
    assert not np.array_equal(other[0], first[0])
