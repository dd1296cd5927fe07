"""Relative TTFT and ITL residuals of a set of observations, in log-parameters. Tuner spec §3.

Residuals are e = (pred - meas) / meas for TTFT and ITL, times sqrt(weight). One vectorised
model call per (max_batch_size, model options) evaluates every observation of one parameter
vector; an observation carrying measured workload CVs is evaluated with them, rounded to
within 5 % (a grid of powers of 1.1): the histograms resolve a CV to about +-25 %, and points of
one steady workload then share a model call (ten distinct CVs made a fit 9x slower). An
observation at or above the model's saturation rate gets a large finite residual, 1e4 x rate /
saturation rate per metric (finite, never inf, so the optimizer's arithmetic stays finite),
which pushes an optimizer back towards stability.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from model.calibration.observation import Observation
from model.calibration.prior import Prior
from model.queueing.analyzer import point_latencies
from model.queueing.chain import kernel_inputs
from model.queueing.kernel import mean as kernel_mean
from model.queueing.params import ServerConfig, ServiceParams
from model.queueing.variant import DEFAULT_MODEL, ModelOptions

FloatArray = NDArray[np.float64]

JACOBIAN_STEP = 1e-3  # in log-parameters (about 0.1 % relative), central differences
_SQRT_EPS = float(np.finfo(np.float64).eps ** 0.5)
FIT_CV_GRID = 1.1  # measured CVs are evaluated at the nearest power of this
UNSTABLE_RESIDUAL = 1e4  # per overloaded observation and metric, times rate / saturation rate
# Log-parameter limits: far outside any physics, they only keep exp() finite and positive when
# an unidentified parameter drifts.
LOG_LOWER = np.log([1e-6, 1e-9, 1e-14])
LOG_UPPER = np.log([1e6, 1e3, 1e1])


class FitProblem:
    """Observations as arrays, grouped by max_batch_size; evaluates relative errors for one
    parameter vector with one model call per group and counts the evaluations."""

    def __init__(
        self,
        observations: Sequence[Observation],
        server: ServerConfig,
        options: ModelOptions = DEFAULT_MODEL,
        *,
        itl_only: bool = False,
    ) -> None:
        if not isinstance(observations, Sequence) or isinstance(observations, str | bytes):
            raise ValueError(
                f"`observations` must be a sequence of Observation, got {observations!r}"
            )
        if len(observations) == 0:
            raise ValueError("`observations` must hold at least one Observation, got 0")
        for k, obs in enumerate(observations):
            if not isinstance(obs, Observation):
                raise ValueError(f"`observations[{k}]` must be an Observation, got {obs!r}")
        if not isinstance(server, ServerConfig):
            raise ValueError(f"`server` must be a ServerConfig, got {server!r}")
        if not isinstance(options, ModelOptions):
            raise ValueError(f"`options` must be a ModelOptions, got {options!r}")
        self.options = options
        if not isinstance(itl_only, bool):
            raise ValueError(f"`itl_only` must be a bool, got {itl_only!r}")
        # The residual columns fitted: TTFT and ITL, or ITL alone (model.calibration.itl_curve).
        self.metrics = slice(1, 2) if itl_only else slice(0, 2)
        self.rate_rps = np.array([o.rate_rps for o in observations])
        self.n_tokens = np.array([o.avg_input_tokens for o in observations])
        self.m_tokens = np.array([o.avg_output_tokens for o in observations])
        self.ttft_ms = np.array([o.ttft_ms for o in observations])
        self.itl_ms = np.array([o.itl_ms for o in observations])
        self.sqrt_weight = np.sqrt(np.array([o.weight for o in observations]))
        self.synchronous = np.array([o.synchronous for o in observations], dtype=bool)
        members: dict[tuple[int, ModelOptions], list[int]] = {}
        for k, obs in enumerate(observations):
            point = obs.model_options(options, grid=FIT_CV_GRID)
            key = (obs.max_batch_size or server.max_batch_size, point)
            members.setdefault(key, []).append(k)
        self.groups: list[tuple[ServerConfig, ModelOptions, NDArray[np.intp]]] = [
            (
                ServerConfig(
                    max_batch_size=size,
                    max_num_batched_tokens=server.max_num_batched_tokens,
                    max_queue_size=server.max_queue_size,
                ),
                point_options,
                np.array(idx, dtype=np.intp),
            )
            for (size, point_options), idx in sorted(members.items(), key=lambda kv: kv[1][0])
        ]
        self.evaluations = 0
        self._last: tuple[bytes, tuple[FloatArray, FloatArray, FloatArray]] | None = None

    @property
    def size(self) -> int:
        return int(self.rate_rps.shape[0])

    def predict_many(self, theta: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Model TTFT, ITL (ms; inf when unstable) and saturation rate (req/s) per point under
        each parameter vector theta[p] = (alpha, beta, gamma) (ms), shape (P, points): one
        compiled call per group."""
        self.evaluations += theta.shape[0]
        # A fit evaluates one vector twice in a row at its start (the stability check, then the
        # optimizer's first residuals) and mostly at its end (the optimizer's last step, then
        # the result's errors): the last single-vector call is kept and served again (counted
        # all the same: `evaluations` counts the vectors asked for).
        key = theta.tobytes() if theta.shape[0] == 1 else None
        if key is not None and self._last is not None and self._last[0] == key:
            return self._last[1]
        found = self._predict_many(theta)
        if key is not None:
            for arr in found:
                arr.flags.writeable = False  # shared with the next call that asks the same
            self._last = (key, found)
        return found

    def _predict_many(self, theta: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        if len(self.groups) == 1:
            cfg, options = self.groups[0][0], self.groups[0][1]
            return point_latencies(
                theta, cfg, self.n_tokens, self.m_tokens, self.rate_rps,
                options=options, synchronous=self.synchronous,
            )  # fmt: skip
        ttft, itl, sat = (np.empty((theta.shape[0], self.size)) for _ in range(3))
        for cfg, options, idx in self.groups:
            out = point_latencies(
                theta, cfg, self.n_tokens[idx], self.m_tokens[idx], self.rate_rps[idx],
                options=options, synchronous=self.synchronous[idx],
            )  # fmt: skip
            ttft[:, idx], itl[:, idx], sat[:, idx] = out
        return ttft, itl, sat

    def predict(self, params: ServiceParams) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Model TTFT, ITL (ms; inf when unstable) and saturation rate (req/s) per point."""
        ttft, itl, sat = self.predict_many(np.array([params.as_tuple()]))
        return ttft[0], itl[0], sat[0]

    def relative_errors(self, params: ServiceParams) -> tuple[FloatArray, FloatArray]:
        """(pred - meas) / meas per point as a (K, 2) array [TTFT, ITL], and the load
        rate / saturation rate per point."""
        ttft, itl, sat = self.predict(params)
        errors = np.stack(
            [(ttft - self.ttft_ms) / self.ttft_ms, (itl - self.itl_ms) / self.itl_ms], 1
        )
        return errors, self.rate_rps / sat

    def residuals_many(self, xs: Sequence[FloatArray]) -> list[FloatArray]:
        """Weighted residual vectors [TTFT errors, ITL errors] (ITL errors alone with
        `itl_only`) at each log-parameter vector; overloaded points get a finite penalty growing
        with the overload."""
        return list(self.residual_rows(np.array(xs)))

    def residual_rows(self, xs: FloatArray) -> FloatArray:
        """`residuals_many` as the rows of one array, at the rows of xs (P, 3)."""
        # As params_from_log (np.clip's layers cost more than the model call at B = 256).
        theta = np.exp(np.minimum(np.maximum(xs, LOG_LOWER), LOG_UPPER))
        key = theta.tobytes() if theta.shape[0] == 1 else None
        if len(self.groups) == 1 and (key is None or self._last is None or self._last[0] != key):
            # One group (the window fit's case): the model call and the residuals' assembly in
            # one compiled call, the same numbers as the numpy assembly below.
            self.evaluations += theta.shape[0]
            cfg, options = self.groups[0][0], self.groups[0][1]
            weighted, predicted = kernel_mean.point_residuals(
                self.n_tokens, self.m_tokens, self.rate_rps, self.synchronous, theta,
                *kernel_inputs(cfg, options), self.ttft_ms, self.itl_ms, self.sqrt_weight,
                self.metrics.start, UNSTABLE_RESIDUAL,
            )  # fmt: skip
            if key is not None:
                predicted.flags.writeable = False  # shared with the next call that asks the same
                self._last = (key, (predicted[0], predicted[1], predicted[2]))
            rows: FloatArray = weighted
            return rows
        ttft, itl, sat = self.predict_many(theta)
        errors = np.stack(
            [(ttft - self.ttft_ms) / self.ttft_ms, (itl - self.itl_ms) / self.itl_ms], 2
        )
        penalty = UNSTABLE_RESIDUAL * (self.rate_rps / sat)[:, :, np.newaxis]
        errors = np.where(np.isfinite(errors), errors, penalty)
        weighted = (errors * self.sqrt_weight[:, np.newaxis])[:, :, self.metrics]
        flat: FloatArray = weighted.transpose(0, 2, 1).reshape(theta.shape[0], -1)
        return flat

    def residuals(self, x: FloatArray) -> FloatArray:
        """`residuals_many` at one log-parameter vector."""
        return self.residuals_many([x])[0]

    def jacobian(self, x: FloatArray) -> FloatArray:
        """Jacobian of `residuals` in log-parameters by central differences:
        J[:, k] = (r(x + h e_k) - r(x - h e_k)) / (2 h), h = JACOBIAN_STEP, the six residual
        vectors in one call. Spec §10.1."""
        steps = JACOBIAN_STEP * np.eye(3)
        found = self.residuals_many([x + steps[k] for k in range(3)] + [x - s for s in steps])
        columns = [(found[k] - found[k + 3]) / (2 * JACOBIAN_STEP) for k in range(3)]
        return np.stack(columns, axis=1)


class PenalizedProblem:
    """The residual vector a MAP fit minimizes: the points' weighted relative errors, then
    (noise_level / sigma_k) (x_k - log centre_k) per log-parameter when there is a prior."""

    def __init__(
        self, problem: FitProblem, prior: Prior | None, noise_level: float, rel_step: float = 1e-3
    ) -> None:
        self.problem = problem
        self.rel_step = rel_step
        self._last: tuple[FloatArray, FloatArray] | None = None
        self._centre: FloatArray | None = None
        if prior is not None:
            self._centre = np.log(np.array(prior.centre.as_tuple()))
            self._scale = noise_level / np.array(prior.log_sigma)

    def residuals(self, x: FloatArray) -> FloatArray:
        out: FloatArray = self.residual_rows(x[np.newaxis, :])[0]
        self._last = (x.copy(), out)
        return out

    def forward_jacobian(self, x: FloatArray) -> FloatArray:
        """The trust-region fit's Jacobian of `residuals` at x: forward differences with the
        relative step `rel_step`, built exactly as scipy's least_squares builds its '2-point'
        Jacobian with `diff_step` (same steps, same arithmetic, the same transposed layout), so
        the fit's iterates are unchanged, without scipy's layers of wrappers around the one
        model call. The residuals at x are those just evaluated there (scipy asks
        for a Jacobian where it last evaluated the residuals), else evaluated now."""
        last = self._last
        f0 = last[1] if last is not None and np.array_equal(last[0], x) else self.residuals(x)
        sign = (x >= 0).astype(float) * 2 - 1
        h = self.rel_step * sign * np.abs(x)
        # A step lost to rounding falls back to sqrt(eps) max(1, |x|), as scipy does.
        h = np.where((x + h) - x == 0, _SQRT_EPS * sign * np.maximum(1.0, np.abs(x)), h)
        shifted = np.tile(x, (x.size, 1))  # row k: x with x_k + h_k
        diagonal = np.arange(x.size)
        shifted[diagonal, diagonal] = x + h
        found = self.residual_rows(shifted)
        columns = (found - f0) / ((x + h) - x)[:, np.newaxis]
        out: FloatArray = columns.T
        return out

    def residuals_many(self, xs: Sequence[FloatArray]) -> list[FloatArray]:
        """`residuals` at each log-parameter vector, evaluated in one model call."""
        return list(self.residual_rows(np.array(xs)))

    def residual_rows(self, xs: FloatArray) -> FloatArray:
        """`residuals_many` as the rows of one array, at the rows of xs (P, 3)."""
        data = self.problem.residual_rows(xs)
        if self._centre is None:
            return data
        out = np.empty((data.shape[0], data.shape[1] + xs.shape[1]))
        out[:, : data.shape[1]] = data
        out[:, data.shape[1] :] = self._scale * (xs - self._centre)
        return out


def params_from_log(x: FloatArray) -> ServiceParams:
    """ServiceParams (ms) from log-parameters, clipped to the far limits."""
    alpha, beta, gamma = np.exp(np.clip(x, LOG_LOWER, LOG_UPPER))
    return ServiceParams(float(alpha), float(beta), float(gamma))
