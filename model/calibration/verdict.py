"""The tuner's states, reasons and status, and the rule that judges a fit. Tuner spec §7.3, §9."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import TypeVar

from model.calibration.fit import FitResult, FitStatus
from model.calibration.observation import Observation
from model.queueing.params import ServiceParams

# A fit that leaves a parameter unidentified (one request shape: beta and gamma trade off) holds
# it at the prior's centre, and is published when it predicts its window this well (mean
# relative error of TTFT and of ITL): it is right for the shapes the deployment serves. The
# bound is loose because sizing corrects a consistent error (Tuner.bias); real engines fit to
# 15-20 % here.
PARTIAL_MAX_ERROR = 0.25

_E = TypeVar("_E", bound=StrEnum)


class TunerState(StrEnum):
    """What the tuner's estimate is; values are exported label values."""

    WARMING = "warming"  # no estimate yet
    FITTED = "fitted"  # the last refit was accepted
    HOLDING = "holding"  # the estimate is older than the last refit (or the seed)


class TunerReason(StrEnum):
    """Why the tuner is in its state; values are exported label values."""

    COLLECTING = "collecting"
    SEEDED = "seeded"
    ACCEPTED = "accepted"
    ACCEPTED_PARTIAL = "accepted_partial"
    NOT_CONVERGED = "not_converged"
    UNSTABLE = "unstable"
    UNIDENTIFIED = "unidentified"
    OUT_OF_BOUNDS = "out_of_bounds"


class SkipReason(StrEnum):
    """Why an observation was kept out of the window; values are exported label values."""

    QUEUE_GROWING = "queue_growing"
    SATURATED = "saturated"


TUNER_MESSAGES: Mapping[TunerReason, str] = MappingProxyType(
    {
        TunerReason.COLLECTING: "collecting observations for the first fit",
        TunerReason.SEEDED: "holding the initial parameters until the window can be fitted "
        "(they are the fit's prior, not a pin)",
        TunerReason.ACCEPTED: "the window fit was accepted",
        TunerReason.ACCEPTED_PARTIAL: "the window fit predicts the observed request shapes; "
        "the parameters it does not identify stay at the prior",
        TunerReason.NOT_CONVERGED: "the window fit did not converge",
        TunerReason.UNSTABLE: "the window fit leaves an observation at or above saturation",
        TunerReason.UNIDENTIFIED: "the window does not identify every parameter",
        TunerReason.OUT_OF_BOUNDS: "the window fit is outside the physical bounds",
    }
)
SKIP_MESSAGES: Mapping[SkipReason, str] = MappingProxyType(
    {
        SkipReason.QUEUE_GROWING: "the observation's queue was growing",
        SkipReason.SATURATED: "the observation is at or above the estimate's saturation rate",
    }
)
_REJECTIONS: Mapping[FitStatus, TunerReason] = MappingProxyType(
    {
        FitStatus.EVALUATION_LIMIT: TunerReason.NOT_CONVERGED,
        FitStatus.UNSTABLE: TunerReason.UNSTABLE,
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class TunerStatus:
    """The tuner after one update: whether a fit was accepted, state, reason, the estimate (ms),
    what became of the observation, and this update's fit (None when none ran)."""

    success: bool
    state: TunerState
    reason: TunerReason
    message: str
    params: ServiceParams | None
    skipped: SkipReason | None  # why the observation stayed out of the window
    dropped_outliers: tuple[Observation, ...]  # window points left out of this update's fit
    fit: FitResult | None
    window_size: int
    fit_count: int


def judge(
    result: FitResult,
    lower_bounds: ServiceParams,
    upper_bounds: ServiceParams,
    *,
    need_identified: bool = True,
) -> TunerReason:
    """The verdict on one window fit: every parameter, identified or held at the prior, must
    lie within the physical bounds, since every one is published and sized with. A partial fit
    must identify some parameter unless `need_identified` is False (the few points after a
    detected change: the prior carries what they cannot pin)."""
    if not result.success:
        return _REJECTIONS.get(result.status, TunerReason.NOT_CONVERGED)
    if not within_bounds(result.params, lower_bounds, upper_bounds):
        return TunerReason.OUT_OF_BOUNDS
    if result.all_identified:
        return TunerReason.ACCEPTED
    worst = max(result.ttft_error.mean_ratio, result.itl_error.mean_ratio)
    if (any(result.identified) or not need_identified) and worst <= PARTIAL_MAX_ERROR:
        return TunerReason.ACCEPTED_PARTIAL
    return TunerReason.UNIDENTIFIED


def checked_bounds(
    lower: ServiceParams, upper: ServiceParams
) -> tuple[ServiceParams, ServiceParams]:
    """(lower, upper) physical bounds, each a ServiceParams and lower below upper in every
    parameter; else a ValueError naming them."""
    for name, bound in (("lower_bounds", lower), ("upper_bounds", upper)):
        if not isinstance(bound, ServiceParams):
            raise ValueError(f"`{name}` must be a ServiceParams, got {bound!r}")
    if not all(lo < hi for lo, hi in zip(lower.as_tuple(), upper.as_tuple(), strict=True)):
        raise ValueError(
            f"`lower_bounds` must be below `upper_bounds` in every parameter, "
            f"got {lower} and {upper}"
        )
    return lower, upper


def status_message(reason: TunerReason, skipped: SkipReason | None) -> str:
    """The status message of a tuner `reason`, led by why the observation was skipped."""
    message = TUNER_MESSAGES[reason]
    return message if skipped is None else f"{SKIP_MESSAGES[skipped]}; {message}"


def within_bounds(params: ServiceParams, lower: ServiceParams, upper: ServiceParams) -> bool:
    """Every parameter within [lower, upper]."""
    values = zip(params.as_tuple(), lower.as_tuple(), upper.as_tuple(), strict=True)
    return all(lo <= v <= hi for v, lo, hi in values)


def parse_enum(cls: type[_E], name: str, value: object) -> _E:
    """`value` as a member of `cls` (a saved state's field `name`), else a ValueError."""
    if isinstance(value, str) and value in {member.value for member in cls}:
        return cls(value)
    allowed = ", ".join(repr(member.value) for member in cls)
    raise ValueError(f"`{name}` must be one of {allowed}, got {value!r}")
