"""The estimate a tuner publishes once per update: one frozen value that sizing, the status and
the what-if all read, so none of them reaches into a tuner another thread may be updating."""

from __future__ import annotations

from dataclasses import dataclass

from model.calibration.observation import Observation
from model.calibration.trust import ModelBias
from model.calibration.verdict import TunerReason, TunerState
from model.queueing.params import ServiceParams


@dataclass(frozen=True, slots=True, kw_only=True)
class TunerEstimate:
    """A tuner's state after its last update: parameters (ms; None while warming), the model's
    bias over the window (with the ITL curve sizing reads ITL from, if any), the calibration
    confidence 0-1, which parameters the data identified, and the last fit's mean relative
    TTFT and ITL errors (None before the first fit)."""

    params: ServiceParams | None
    bias: ModelBias | None
    confidence: float
    identified: tuple[bool, bool, bool]
    state: TunerState
    reason: TunerReason
    fit_ttft_error: float | None
    fit_itl_error: float | None
    # The observations the fit saw, oldest first: the evidence capacity claims are bounded by.
    window: tuple[Observation, ...] = ()

    @property
    def itl_curve(self) -> ServiceParams | None:
        """Parameters (ms) of ITL alone against load, when the tuner has a curve."""
        return None if self.bias is None else self.bias.itl_curve
