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

from bench.baseline.vendor.model.calibration.observation import Observation
from bench.baseline.vendor.model.calibration.prior import Prior
from bench.baseline.vendor.model.queueing.analyzer import analyze_points
from bench.baseline.vendor.model.queueing.params import ServerConfig, ServiceParams
from bench.baseline.vendor.model.queueing.variant import DEFAULT_MODEL, ModelOptions

FloatArray = NDArray[np.float64]

JACOBIAN_STEP = 1e-3  # in log-parameters (about 0.1 % relative), central differences
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

    @property
    def size(self) -> int:
        return int(self.rate_rps.shape[0])

    def predict(self, params: ServiceParams) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Model TTFT, ITL (ms; inf when unstable) and saturation rate (req/s) per point."""
        self.evaluations += 1
        if len(self.groups) == 1:
            cfg, options = self.groups[0][0], self.groups[0][1]
            out = analyze_points(
                params,
                cfg,
                self.n_tokens,
                self.m_tokens,
                self.rate_rps,
                options=options,
                synchronous=self.synchronous,
            )
            return (
                np.asarray(out.ttft_ms),
                np.asarray(out.itl_ms),
                np.asarray(out.saturation_rate_rps),
            )
        ttft, itl, sat = (np.empty(self.size) for _ in range(3))
        for cfg, options, idx in self.groups:
            out = analyze_points(
                params,
                cfg,
                self.n_tokens[idx],
                self.m_tokens[idx],
                self.rate_rps[idx],
                options=options,
                synchronous=self.synchronous[idx],
            )
            ttft[idx], itl[idx], sat[idx] = out.ttft_ms, out.itl_ms, out.saturation_rate_rps
        return ttft, itl, sat

    def relative_errors(self, params: ServiceParams) -> tuple[FloatArray, FloatArray]:
        """(pred - meas) / meas per point as a (K, 2) array [TTFT, ITL], and the load
        rate / saturation rate per point."""
        ttft, itl, sat = self.predict(params)
        errors = np.stack(
            [(ttft - self.ttft_ms) / self.ttft_ms, (itl - self.itl_ms) / self.itl_ms], 1
        )
        return errors, self.rate_rps / sat

    def residuals(self, x: FloatArray) -> FloatArray:
        """Weighted residual vector [TTFT errors, ITL errors] at log-parameters x; overloaded
        points get a finite penalty growing with the overload."""
        errors, load = self.relative_errors(params_from_log(x))
        penalty = UNSTABLE_RESIDUAL * load[:, np.newaxis]
        errors = np.where(np.isfinite(errors), errors, penalty)
        weighted: FloatArray = (errors * self.sqrt_weight[:, np.newaxis]).T.reshape(-1)
        return weighted

    def jacobian(self, x: FloatArray) -> FloatArray:
        """Jacobian of `residuals` in log-parameters by central differences:
        J[:, k] = (r(x + h e_k) - r(x - h e_k)) / (2 h), h = JACOBIAN_STEP. Spec §10.1."""
        columns = []
        for k in range(3):
            step = np.zeros(3)
            step[k] = JACOBIAN_STEP
            columns.append(
                (self.residuals(x + step) - self.residuals(x - step)) / (2 * JACOBIAN_STEP)
            )
        return np.stack(columns, axis=1)


class PenalizedProblem:
    """The residual vector a MAP fit minimizes: the points' weighted relative errors, then
    (noise_level / sigma_k) (x_k - log centre_k) per log-parameter when there is a prior."""

    def __init__(self, problem: FitProblem, prior: Prior | None, noise_level: float) -> None:
        self.problem = problem
        self._centre: FloatArray | None = None
        if prior is not None:
            self._centre = np.log(np.array(prior.centre.as_tuple()))
            self._scale = noise_level / np.array(prior.log_sigma)

    def residuals(self, x: FloatArray) -> FloatArray:
        data = self.problem.residuals(x)
        if self._centre is None:
            return data
        return np.concatenate([data, self._scale * (x - self._centre)])


def params_from_log(x: FloatArray) -> ServiceParams:
    """ServiceParams (ms) from log-parameters, clipped to the far limits."""
    alpha, beta, gamma = np.exp(np.clip(x, LOG_LOWER, LOG_UPPER))
    return ServiceParams(float(alpha), float(beta), float(gamma))
