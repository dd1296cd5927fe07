"""How far a tuner's estimate can be trusted: change detection, the robust window figures and
the calibration confidence (0-1) exported as `vllm_sizer_calibration_confidence`.

Change: the estimate's relative errors on the newest CHANGE_RUN points all lie on one side of
the older points' median error, by more than max(CHANGE_MIN_SHIFT, CHANGE_SIGMAS x the older
points' robust spread (1.4826 x MAD)), for TTFT or for ITL, and they agree (their shifts span
at most CHANGE_AGREEMENT of their mean: a level shift, not a ramp's growing lag). The
deployment changed (a new engine version, another accelerator clock): the tuner then keeps
only those newest points.

Confidence C (`confidence`; defined in docs/concepts/confidence.md) is 0 while warming (no
estimate); otherwise C = Q x min(E, H, D) with
- Q, what the data identified: 1 when the published fit identified every parameter; for a
  partial fit (the prior holds what the data left open) PARTIAL_SPREAD_SHARE when the points
  seen since the last change spread the load (`spread_loads`), and
  ONE_POINT_SHARE, below TRUSTED_CONFIDENCE, when they sit at one operating point: there a fit
  pins a level but not how latency grows with load, so its capacity is an extrapolation;
- E, how well predictions held out of sample: piecewise linear in e, the median over the last
  HELD_OUT_HISTORY cycles of the next window's error (each new point predicted by the estimate
  made without it, corrected by the median bias sizing applies; the larger of TTFT and ITL):
  1 at e <= 0.10, 0.5 at 0.25, 0 at e >= 0.50; below TRUSTED_CONFIDENCE (UNTESTED_CAP) until
  HELD_OUT_MIN next windows were predicted. The errors of the points a detected change kept
  leave the record (they measured the change; D stands for it), and with none left E is 1;
- H = piecewise linear in the number h of updates the estimate has been held (no fit accepted):
  1 at h <= 1, 0.5 at 4, 0 at h >= 7;
- D = 0.5 right after a detected change, rising linearly to 1 once `settle` updates passed.
"Trusted" is C >= TRUSTED_CONFIDENCE (`is_trusted`). A fully identified estimate whose next
windows came within 10 % has C = 1; a partial fit at one operating point never reaches the
threshold, however well it predicts the point it sits at.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from model.calibration.medians import column_medians, median, percentiles
from model.calibration.observation import Observation
from model.calibration.residuals import FitProblem
from model.queueing.params import ServerConfig, ServiceParams
from model.queueing.variant import ModelOptions

FloatArray = NDArray[np.float64]

# One threshold for "trusted": at or above it the sizer's own count is followed; below it the
# hand-over count is. Read by replay's hand-over and the shipped KEDA and HPA queries (config/k8s).
TRUSTED_CONFIDENCE = 0.5

CHANGE_RUN = 3  # newest points that must agree on a change
CHANGE_BASE = 5  # older points the newest are compared with, at least
CHANGE_MIN_SHIFT = 0.08  # smallest relative shift called a change
CHANGE_SIGMAS = 3.0  # ... and at least this many robust standard deviations of the older points
CHANGE_AGREEMENT = 0.5  # the newest points' shifts span at most this share of their mean
MAD_TO_SIGMA = 1.4826
ERROR_ANCHORS = ((0.10, 0.25, 0.50), (1.0, 0.5, 0.0))
PARTIAL_SPREAD_SHARE = 0.8
ONE_POINT_SHARE = 0.45
# The rate ratio (80th over 20th percentile, of the points the ITL curve keeps to spread the
# loads) from which the points are more than one operating point: the arrival noise of 5 s
# windows at one constant 11 req/s spreads them to at most 1.21 (two seeds), a load wandering
# over 0.3-0.7 of saturation to a median 1.46-1.49 (occupancy rates; percentiles, since the
# curve keeps the noise's extremes).
SPREAD_RATIO = 1.3
SPREAD_QUANTILES = (20.0, 80.0)
HELD_OUT_HISTORY = 10
HELD_OUT_MIN = 3
UNTESTED_CAP = 0.45
HOLD_ANCHORS = ((1.0, 4.0, 7.0), (1.0, 0.5, 0.0))
CHANGE_FLOOR = 0.5
# The load part of a latency (`load_part_bias`) is read where it is at least this share of it.
LOAD_PART_MIN_SHARE = 0.1
LOAD_PART_MIN_POINTS = 3
# Before the first fit: a TTFT this many times the prior centre's light-traffic TTFT is queueing.
COLD_SATURATION_FACTOR = 10.0
LIGHT_RATE_RPS = 1e-6


class ModelBias(NamedTuple):
    """Median relative errors (pred - meas) / meas of an estimate over its window: TTFT, ITL,
    and ITL's load-dependent part (`load_part_bias`; None where the loads are too light); or,
    instead of that part, the ITL curve (`model.calibration.itl_curve`) ITL is read from, when
    there is one."""

    ttft: float
    itl: float
    itl_load: float | None = None
    itl_curve: ServiceParams | None = None


def robust_spread(rows: FloatArray) -> FloatArray:
    """Per column of (K, 2) rows, MAD_TO_SIGMA x the median absolute deviation: a standard
    deviation that a few tail rows cannot move."""
    centre = column_medians(rows)
    spread: FloatArray = MAD_TO_SIGMA * column_medians(np.abs(rows - centre))
    return spread


def changed(errors: FloatArray) -> bool:
    """Whether the newest CHANGE_RUN rows of (K, 2) relative errors [TTFT, ITL] (oldest first)
    moved away from the older ones (module docstring); needs CHANGE_RUN + CHANGE_BASE finite
    rows."""
    rows = errors[np.isfinite(errors).all(axis=1)]
    if rows.shape[0] < CHANGE_RUN + CHANGE_BASE:
        return False
    old, new = rows[:-CHANGE_RUN], rows[-CHANGE_RUN:]
    centre = column_medians(old)
    limit = np.maximum(CHANGE_MIN_SHIFT, CHANGE_SIGMAS * robust_spread(old))
    shift = new - centre
    # A level shift, not a trend: the newest points agree with each other (a ramp's windows,
    # still filling the batch, drift further off one after the other).
    level = np.ptp(shift, axis=0) <= CHANGE_AGREEMENT * np.abs(np.mean(shift, axis=0))
    beyond = np.all(shift > limit, axis=0) | np.all(shift < -limit, axis=0)
    return bool(np.any(beyond & level))


def looks_saturated(
    observation: Observation, centre: ServiceParams, server: ServerConfig, options: ModelOptions
) -> bool:
    """With no fitted estimate to judge by: the TTFT (ms) is above COLD_SATURATION_FACTOR x the
    light-traffic TTFT of `centre` at the observation's shape, a queue no steady state explains
    (a centre off by 2-3x still leaves a wide margin)."""
    light = Observation(
        rate_rps=LIGHT_RATE_RPS,
        avg_input_tokens=observation.avg_input_tokens,
        avg_output_tokens=observation.avg_output_tokens,
        ttft_ms=observation.ttft_ms,
        itl_ms=observation.itl_ms,
        max_batch_size=observation.max_batch_size,
    )
    ttft, _, _ = FitProblem([light], server, options).predict(centre)
    return bool(observation.ttft_ms > COLD_SATURATION_FACTOR * ttft[0])


def robust_bias(errors: FloatArray) -> tuple[float, float] | None:
    """Median signed relative error (TTFT, ITL) over the finite rows; None without one."""
    rows = errors[np.isfinite(errors).all(axis=1)]
    if rows.shape[0] == 0:
        return None
    centre = column_medians(rows)
    return float(centre[0]), float(centre[1])


def load_part_bias(
    predicted_ms: FloatArray, light_ms: FloatArray, measured_ms: FloatArray
) -> float | None:
    """Median relative error of the load-dependent part of a latency: (pred - light) /
    (meas - light) - 1 per point, `light` the model's latency of the point's shape at an empty
    engine; None unless at least half the points (and LOAD_PART_MIN_POINTS) carry a load part
    of at least LOAD_PART_MIN_SHARE of what was measured. A model whose parameters a single
    shape bends (alpha up, the ITL curve flattened) is off in how latency grows with load, not
    by one factor: a factor measured at the window's loads, applied at an empty engine, can call
    a target infeasible that the replica meets at light load."""
    pred_part, meas_part = predicted_ms - light_ms, measured_ms - light_ms
    ok = np.isfinite(pred_part) & (pred_part > 0) & (meas_part >= LOAD_PART_MIN_SHARE * measured_ms)
    count = int(np.count_nonzero(ok))
    if count < max(LOAD_PART_MIN_POINTS, (predicted_ms.size + 1) // 2):
        return None
    return median(pred_part[ok] / meas_part[ok]) - 1.0


def window_itl_load_bias(
    observations: list[Observation],
    params: ServiceParams,
    server: ServerConfig,
    options: ModelOptions,
) -> float | None:
    """`load_part_bias` of ITL for `params` over the observations. Sizing corrects the load
    part of ITL by it, so a correction measured at the window's loads is not carried to an
    empty engine."""
    _, itl, _ = FitProblem(observations, server, options).predict(params)
    light = [replace(obs, rate_rps=LIGHT_RATE_RPS) for obs in observations]
    _, empty, _ = FitProblem(light, server, options).predict(params)
    return load_part_bias(itl, empty, np.array([obs.itl_ms for obs in observations]))


def window_error(errors: FloatArray, bias: tuple[float, float]) -> float:
    """The larger of TTFT and ITL of the median |relative error| left after dividing the
    predictions by (1 + bias)."""
    rows = errors[np.isfinite(errors).all(axis=1)]
    if rows.shape[0] == 0:
        return float("inf")
    corrected = (1.0 + rows) / (1.0 + np.array(bias)) - 1.0
    return float(np.max(column_medians(np.abs(corrected))))


def held_out_error(innovation: FloatArray, bias: tuple[float, float] | None) -> float:
    """A new point's error under the estimate made without it: the larger of TTFT and ITL of
    |relative error| left after dividing the prediction by (1 + bias); inf when not finite."""
    if not np.all(np.isfinite(innovation)):
        return float("inf")
    centre = np.zeros(2) if bias is None else np.array(bias)
    corrected = (1.0 + innovation) / (1.0 + centre) - 1.0
    return float(np.max(np.abs(corrected)))


def spread_loads(rates_rps: FloatArray) -> bool:
    """The points' rates span at least SPREAD_RATIO between SPREAD_QUANTILES: more than one
    operating point."""
    rates = rates_rps[np.isfinite(rates_rps) & (rates_rps > 0)]
    if rates.size < 2:
        return False
    low, high = percentiles(rates, SPREAD_QUANTILES)
    return bool(high >= SPREAD_RATIO * low)


def confidence(
    *,
    has_estimate: bool,
    all_identified: bool,
    loads_spread: bool,
    held_out: FloatArray,
    tested: int,
    held_updates: int,
    since_change: int | None,
    settle: int,
) -> float:
    """Calibration confidence 0-1 (module docstring). `held_out` holds the newest next-window
    errors (`held_out_error`; those a detected change explains left out), `tested` counts
    every next window predicted, `since_change` counts the cycles (updates or idle ones) since
    the last detected change (None: none seen), `settle` how many it takes to recover."""
    if not has_estimate:
        return 0.0
    if all_identified:
        share = 1.0
    else:
        share = PARTIAL_SPREAD_SHARE if loads_spread else ONE_POINT_SHARE
    recent = held_out[-HELD_OUT_HISTORY:]
    error = median(recent) if recent.size else 0.0
    e = float(np.interp(error, *ERROR_ANCHORS)) if np.isfinite(error) else 0.0
    if tested < HELD_OUT_MIN:
        e = min(e, UNTESTED_CAP)
    h = float(np.interp(held_updates, *HOLD_ANCHORS))
    d = 1.0
    if since_change is not None and since_change < settle:
        d = CHANGE_FLOOR + (1.0 - CHANGE_FLOOR) * since_change / settle
    return share * min(e, h, d)


def is_trusted(confidence_value: float) -> bool:
    """The calibration is trusted: its confidence reaches TRUSTED_CONFIDENCE."""
    return confidence_value >= TRUSTED_CONFIDENCE
