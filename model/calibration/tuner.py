"""Live estimator of (alpha, beta, gamma): a sliding window refitted every cycle. Tuner spec §6-§10.

One Tuner per deployment, one Observation per cycle (spec §2). Each accepted observation joins
a window of the newest `window_size` (spec §7.1); from `min_observations` on, every update
refits the window warm-started from the current estimate (spec §7.3, §16 #4), trimmed (below),
and accepts the fit only if it converged, lies within the physical bounds and either identifies
every parameter or predicts its window within PARTIAL_MAX_ERROR; otherwise the last good
estimate is held (spec §7.3 step 6, §9). Deviations, [REC]s of the spec or fixes of what one
request shape did to it:
- a MAP fit (`prior`): per parameter, a weak prior centred on the last value the data
  identified, else the seed (configured, or restored under changed settings: a centre the data
  replaces as it warrants, never a pin), else the physical or generic prior; on steady traffic
  narrowed around the estimate (`memory`);
- trimmed refits (worst point left out while its error norm exceeds `residual_threshold`, up to
  a third of the window; spec §7.3 step 5 repeated) and a median bias: spikes move neither;
- saturated observations never enter the window (spec §8): `queue_growing`, or a rate at or
  above `saturation_fraction` of the *fitted* estimate's saturation rate; after `window_size`
  such skips in a row the data decides again (an estimate too slow cannot lock itself out; spec
  §16 #12-14). Cold, `trust.looks_saturated` and `window_fit.without_saturated` keep such
  points out of the first fit;
- a detected change (`change_watch`: a CUSUM of each new point's error under the estimate made
  without it, or `trust.changed`) cuts the window to the points since it, fitted with the prior;
- identifiability is the per-parameter standard-error test of `model.fit`, not kappa alone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from model.calibration.change_watch import ChangeWatch, Innovation, innovate, points_since_change
from model.calibration.estimate import TunerEstimate
from model.calibration.fit import DEFAULT_MAX_STD_ERROR, FitResult, fit
from model.calibration.itl_curve import ItlCurve
from model.calibration.memory import CalibrationMemory
from model.calibration.observation import Observation
from model.calibration.prior import GENERIC_PRIOR, Prior
from model.calibration.residuals import FitProblem
from model.calibration.trust import (
    CHANGE_RUN,
    ModelBias,
    looks_saturated,
    robust_bias,
    spread_loads,
)
from model.calibration.trust import window_itl_load_bias as itl_load_bias
from model.calibration.verdict import (
    SkipReason,
    TunerReason,
    TunerState,
    TunerStatus,
    checked_bounds,
    judge,
    parse_enum,
    status_message,
)
from model.calibration.window_fit import trimmed, without_saturated
from model.queueing.params import ServerConfig, ServiceParams
from model.queueing.validation import require_int_at_least, require_non_negative, require_positive
from model.queueing.variant import DEFAULT_MODEL, ModelOptions

DEFAULT_MIN_OBSERVATIONS = 5  # spec §13 TUNER_INIT_OBS
DEFAULT_WINDOW_SIZE = 10  # spec §13 TUNER_WINDOW_SIZE
DEFAULT_RESIDUAL_THRESHOLD = 0.5  # spec §13 TUNER_RESIDUAL_THRESHOLD; 0 turns the pass off
DEFAULT_SATURATION_FRACTION = 1.0  # of the model's saturation rate; None turns the test off
# Physical bounds (ms): wider than any GPU or CPU deployment seen (spec §1.1), tight enough to
# catch a runaway fit.
DEFAULT_LOWER_BOUNDS = ServiceParams(1e-2, 1e-6, 1e-10)
DEFAULT_UPPER_BOUNDS = ServiceParams(1e4, 1e2, 1.0)
STATE_VERSION = 1


class Tuner:
    """Sliding-window estimator of one deployment's ServiceParams; feed one Observation per
    cycle to `update` and persist `to_dict()`."""

    def __init__(
        self,
        server: ServerConfig | None = None,
        *,
        initial: ServiceParams | None = None,
        min_observations: int = DEFAULT_MIN_OBSERVATIONS,
        window_size: int = DEFAULT_WINDOW_SIZE,
        residual_threshold: float = DEFAULT_RESIDUAL_THRESHOLD,
        saturation_fraction: float | None = DEFAULT_SATURATION_FRACTION,
        lower_bounds: ServiceParams = DEFAULT_LOWER_BOUNDS,
        upper_bounds: ServiceParams = DEFAULT_UPPER_BOUNDS,
        max_std_error: float = DEFAULT_MAX_STD_ERROR,
        options: ModelOptions = DEFAULT_MODEL,
        prior: Prior = GENERIC_PRIOR,
    ) -> None:
        """`initial` is a seed: held until the first fit, and the prior's centre until the data
        identifies each parameter; `prior` is the centre without one (physical or generic)."""
        self.server = ServerConfig() if server is None else server
        if not isinstance(self.server, ServerConfig):
            raise ValueError(f"`server` must be a ServerConfig, got {server!r}")
        if initial is not None and not isinstance(initial, ServiceParams):
            raise ValueError(f"`initial` must be a ServiceParams or None, got {initial!r}")
        self.window_size = require_int_at_least("window_size", window_size, 1)
        self.min_observations = require_int_at_least("min_observations", min_observations, 1)
        if self.min_observations > self.window_size:
            raise ValueError(
                f"`min_observations` must be an integer <= window_size ({self.window_size}), "
                f"got {min_observations}"
            )
        self.residual_threshold = require_non_negative("residual_threshold", residual_threshold)
        self.saturation_fraction = (
            None
            if saturation_fraction is None
            else require_positive("saturation_fraction", saturation_fraction)
        )
        self.lower_bounds, self.upper_bounds = checked_bounds(lower_bounds, upper_bounds)
        self.max_std_error = require_positive("max_std_error", max_std_error)
        if not isinstance(options, ModelOptions):
            raise ValueError(f"`options` must be a ModelOptions, got {options!r}")
        self.options = options
        if not isinstance(prior, Prior):
            raise ValueError(f"`prior` must be a Prior, got {prior!r}")
        self.prior = prior
        self.initial = initial
        self._memory = CalibrationMemory()
        self._watch = ChangeWatch()
        self._window: deque[Observation] = deque(maxlen=self.window_size)
        self._curve = ItlCurve()
        self._params = initial
        self._state = TunerState.WARMING if initial is None else TunerState.HOLDING
        self._reason = TunerReason.COLLECTING if initial is None else TunerReason.SEEDED
        self._last_fit: FitResult | None = None
        self._fit_count = 0
        self._skipped = dict.fromkeys(SkipReason, 0)
        self._saturated_run = 0  # model-saturated observations skipped in a row
        self._estimate: TunerEstimate | None = None  # frozen on first request after an update

    @property
    def params(self) -> ServiceParams | None:
        """The current estimate (ms); None while warming."""
        return self._params

    @property
    def state(self) -> TunerState:
        return self._state

    @property
    def reason(self) -> TunerReason:
        return self._reason

    @property
    def message(self) -> str:
        return status_message(self._reason, None)

    @property
    def last_fit(self) -> FitResult | None:
        """The most recent window fit, accepted or not."""
        return self._last_fit

    @property
    def window(self) -> tuple[Observation, ...]:
        """The observations the next fit uses, oldest first."""
        return tuple(self._window)

    @property
    def fit_count(self) -> int:
        """Number of accepted fits."""
        return self._fit_count

    def _window_errors(self) -> NDArray[np.float64] | None:
        """(K, 2) relative errors of the current estimate over the window, or None."""
        if self._params is None or not self._window:
            return None
        if self._last_fit is not None and self._last_fit.params == self._params:
            if len(self._last_fit.residuals) == len(self._window):
                return self._last_fit.residuals  # the accepted fit already evaluated its window
        problem = FitProblem(list(self._window), self.server, self.options)
        errors, _ = problem.relative_errors(self._params)
        return errors

    def bias(self) -> ModelBias | None:
        """Median signed relative error (pred - meas) / meas of the current estimate over the
        window, TTFT and ITL, and, without an `itl_curve` for sizing to read ITL from, that of
        ITL's load-dependent part (`trust.ModelBias`); None without an estimate or a window. The
        fit trades TTFT against ITL, so sizing corrects for it; medians, so spikes cannot."""
        errors = self._window_errors()
        median = None if errors is None else robust_bias(errors)
        if median is None or self._params is None:
            return None
        curve = self.itl_curve
        load = None if curve is not None else itl_load_bias(
            list(self._window), self._params, self.server, self.options
        )  # fmt: skip
        return ModelBias(*self._memory.smooth_bias(median), load, curve)

    @property
    def itl_curve(self) -> ServiceParams | None:
        """Parameters (ms) of ITL alone against load at this deployment's shape
        (`model.calibration.itl_curve`); None without an estimate or enough points."""
        if self._params is None:
            return None
        bounds = (self.lower_bounds, self.upper_bounds)
        return self._curve.params(self.server, self.options, self._params, bounds)

    @property
    def identified(self) -> tuple[bool, bool, bool]:
        """Per parameter: the published estimate's value comes from data (else: the prior)."""
        return self._memory.identified

    def confidence(self) -> float:
        """Calibration confidence 0-1 (`model.calibration.trust`; docs/concepts/confidence.md)."""
        spread, settle = self._curve.loads_spread, self.min_observations
        return self._memory.confidence(self._params is not None, spread, settle)

    def estimate(self) -> TunerEstimate:
        """The frozen estimate after the last update or idle cycle: computed on the first call
        after it (the bias, the ITL curve when due, the confidence), the same value after."""
        if self._estimate is None:
            fit = self._last_fit
            self._estimate = TunerEstimate(
                params=self._params, bias=self.bias(), confidence=self.confidence(),
                identified=self.identified, state=self._state, reason=self._reason,
                fit_ttft_error=None if fit is None else fit.ttft_error.mean_ratio,
                fit_itl_error=None if fit is None else fit.itl_error.mean_ratio,
                window=self.window,
            )  # fmt: skip
        return self._estimate

    def current_prior(self) -> Prior:
        """The prior of the next fit: narrow around the estimate on steady traffic, else per
        parameter on the last value identified, the seed, or `prior` (`CalibrationMemory.prior`)."""
        recovering, bounds = self._recovering(), (self.lower_bounds, self.upper_bounds)
        steady = None if self._fit_count == 0 or recovering else self._params
        one_load = recovering and not spread_loads(np.array([o.rate_rps for o in self._window]))
        return self._memory.prior(
            self.prior, self.initial, bounds, steady, recovering=recovering, one_load=one_load
        )

    @property
    def skipped(self) -> Mapping[SkipReason, int]:
        """Observations kept out of the window so far, per reason."""
        return MappingProxyType(dict(self._skipped))

    def idle(self) -> None:
        """A cycle passed without a point (the daemon found its window unsteady, e.g. pods
        came or went): it counts toward a recovery all the same (`CalibrationMemory.tick`)."""
        self._estimate = None
        self._memory.tick()

    def update(self, observation: Observation) -> TunerStatus:
        """Take one cycle's observation; refit the window when it holds enough points."""
        if not isinstance(observation, Observation):
            raise ValueError(f"`observation` must be an Observation, got {observation!r}")
        self._estimate = None
        memory = self._memory
        memory.tick()
        params = self._params if self._fit_count > 0 else None
        innovation = (
            None if params is None else innovate(observation, params, self.server, self.options)
        )
        skip = self._skip_reason(observation, innovation)
        if innovation is not None and skip is not SkipReason.QUEUE_GROWING:
            memory.record_held_out(innovation.errors, self._window_errors())
        if skip is not None:
            self._skipped[skip] += 1
            memory.held += self._params is not None
            return self._status(success=False, skipped=skip)
        began = None if innovation is None else self._watch.judge(innovation)
        self._window.append(observation)
        self._curve.add(observation)
        self._cut_on_change(began)
        # After a change cut the window, its newest points are fitted at once (with the prior).
        needed = CHANGE_RUN if self._fit_count > 0 else self.min_observations
        if len(self._window) < min(needed, self.min_observations):
            memory.held += self._params is not None
            return self._status(success=False)
        result, dropped = self._refit()
        self._last_fit = result
        verdict = judge(
            result, self.lower_bounds, self.upper_bounds, need_identified=not self._recovering()
        )
        accepted = verdict in (TunerReason.ACCEPTED, TunerReason.ACCEPTED_PARTIAL)
        if accepted:
            self._params = result.params
            memory.accept(result.params, result.identified)
            self._state = TunerState.FITTED
            self._fit_count += 1
        else:
            self._state = TunerState.WARMING if self._params is None else TunerState.HOLDING
            memory.held += self._params is not None
        self._reason = verdict
        return self._status(success=accepted, dropped=dropped, result=result)

    def _recovering(self) -> bool:
        """From a detected change until the window is full again (no steady prior then)."""
        return self._memory.since_change is not None and len(self._window) < self.window_size

    def _cut_on_change(self, began: int | None) -> None:
        """Keep only the points since a change (`change_watch.points_since_change`), centring
        the prior on the estimate that judged the first of them (`ChangeWatch.judged_by`)."""
        if self._params is None or self._fit_count == 0:
            return
        window = list(self._window)
        keep = points_since_change(began, window, self._params, self.server, self.options)
        if keep is not None:
            self._window = deque(window[-keep:], maxlen=self.window_size)
            self._curve.restart(self._window)
            self._memory.changed(self._watch.judged_by(keep) or self._params, keep)
            self._watch.reset()

    def _skip_reason(self, obs: Observation, fitted: Innovation | None) -> SkipReason | None:
        if obs.queue_growing:
            return SkipReason.QUEUE_GROWING
        if self.saturation_fraction is None:
            return None
        if fitted is None:
            cold = looks_saturated(obs, self.current_prior().centre, self.server, self.options)
            return SkipReason.SATURATED if cold else None
        if fitted.load < self.saturation_fraction:
            self._saturated_run = 0
            return None
        if self._saturated_run >= self.window_size:
            return None  # the estimate, not the deployment, looks wrong: let the data decide
        self._saturated_run += 1
        return SkipReason.SATURATED

    def _refit(self) -> tuple[FitResult, tuple[Observation, ...]]:
        """Fit the window; cold, without points the fit puts at saturation (they leave the
        window); then trimmed, at most a third of the window (`window_fit`)."""
        kept = list(self._window)
        start = self._params
        if start is None and (self.initial is not None or self.prior is not GENERIC_PRIOR):
            start = self.current_prior().centre
        result = self._fit(kept, start)
        if self._fit_count == 0:
            rest, result = without_saturated(kept, result, self._fit, self.server, self.options)
            if len(rest) < len(kept):
                self._skipped[SkipReason.SATURATED] += len(kept) - len(rest)
                self._window = deque(rest, maxlen=self.window_size)
                self._curve.restart(rest)
                kept = list(rest)
        max_trim = (len(self._window) - 1) // 3
        return trimmed(kept, result, self._fit, self.residual_threshold, max_trim)

    def _fit(self, observations: list[Observation], start: ServiceParams | None) -> FitResult:
        return fit(
            observations,
            self.server,
            start,
            options=self.options,
            max_std_error=self.max_std_error,
            prior=self.current_prior(),
        )

    def _status(
        self,
        *,
        success: bool,
        skipped: SkipReason | None = None,
        dropped: tuple[Observation, ...] = (),
        result: FitResult | None = None,
    ) -> TunerStatus:
        return TunerStatus(
            success=success, state=self._state, reason=self._reason,
            message=status_message(self._reason, skipped), params=self._params, skipped=skipped,
            dropped_outliers=dropped, fit=result, window_size=len(self._window),
            fit_count=self._fit_count,
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe state: configuration, estimate, window and last fit."""
        return {
            "version": STATE_VERSION,
            "config": {
                "server": self.server.to_dict(),
                "initial": None if self.initial is None else self.initial.to_dict(),
                "min_observations": self.min_observations,
                "window_size": self.window_size,
                "residual_threshold": self.residual_threshold,
                "saturation_fraction": self.saturation_fraction,
                "lower_bounds": self.lower_bounds.to_dict(),
                "upper_bounds": self.upper_bounds.to_dict(),
                "max_std_error": self.max_std_error,
                "options": self.options.to_dict(),
                "prior": self.prior.to_dict(),
            },
            "state": self._state.value,
            "reason": self._reason.value,
            "params": None if self._params is None else self._params.to_dict(),
            "fit_count": self._fit_count,
            **self._memory.to_dict(),
            "change_watch": self._watch.to_dict(),
            "skipped": {reason.value: count for reason, count in self._skipped.items()},
            "saturated_run": self._saturated_run,
            "window": [obs.to_dict() for obs in self._window],
            "itl_curve": [obs.to_dict() for obs in self._curve.points],
            "last_fit": None if self._last_fit is None else self._last_fit.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Tuner:
        """Inverse of to_dict; a malformed state is a ValueError naming what is wrong."""
        if not isinstance(data, Mapping) or data.get("version") != STATE_VERSION:
            version = data.get("version") if isinstance(data, Mapping) else data
            raise ValueError(f"`version` must be {STATE_VERSION}, got {version!r}")
        try:
            cfg = data["config"]
            tuner = cls(
                ServerConfig(**cfg["server"]),
                initial=_params_or_none(cfg["initial"]),
                min_observations=cfg["min_observations"],
                window_size=cfg["window_size"],
                residual_threshold=cfg["residual_threshold"],
                saturation_fraction=cfg["saturation_fraction"],
                lower_bounds=ServiceParams.from_dict(cfg["lower_bounds"]),
                upper_bounds=ServiceParams.from_dict(cfg["upper_bounds"]),
                max_std_error=cfg["max_std_error"],
                options=ModelOptions.from_dict(cfg["options"]),
                prior=Prior.from_dict(cfg["prior"]) if "prior" in cfg else GENERIC_PRIOR,
            )
            state = parse_enum(TunerState, "state", data["state"])
            reason = parse_enum(TunerReason, "reason", data["reason"])
            params = _params_or_none(data["params"])
            tuner._window.extend(Observation.from_dict(obs) for obs in data["window"])
            # A state saved before the curve existed: its window is the curve's start.
            curve = data.get("itl_curve", data["window"])
            tuner._curve.restart([Observation.from_dict(obs) for obs in curve])
            last_fit = data["last_fit"]
            tuner._last_fit = None if last_fit is None else FitResult.from_dict(last_fit)
            tuner._fit_count = require_int_at_least("fit_count", data["fit_count"], 0)
            tuner._saturated_run = require_int_at_least("saturated_run", data["saturated_run"], 0)
            tuner._memory = CalibrationMemory.from_dict(data, params)
            tuner._watch = ChangeWatch.from_dict(data.get("change_watch"))
            for key, count in data["skipped"].items():
                skip = parse_enum(SkipReason, "skipped", key)
                tuner._skipped[skip] = require_int_at_least(f"skipped.{key}", count, 0)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"`tuner state` is malformed: missing or bad {exc!r}") from exc
        if (params is None) != (state is TunerState.WARMING):
            raise ValueError(f"`params` must be present exactly when not warming, got {state}")
        tuner._state, tuner._reason, tuner._params = state, reason, params
        return tuner


def _params_or_none(data: Mapping[str, float] | None) -> ServiceParams | None:
    return None if data is None else ServiceParams.from_dict(dict(data))
