"""The bias-corrected model of one deployment: replicas for a total rate, latencies at a
per-replica rate. Shared by the recommender, scale from zero and the what-if API."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from exporter.config.values import DeploymentConfig
from exporter.sizing.slo_targets import PredictedPercentile, predicted_percentiles, tightened
from exporter.sizing.traffic import ModelInputs
from model import (
    PercentileTarget,
    ReplicaPlan,
    ServiceParams,
    Workload,
    analyze,
    replicas_for_slo,
)
from model.calibration.trust import LIGHT_RATE_RPS, ModelBias

# Bias corrections are bounded: a larger error means the estimate is wrong, not biased.
MAX_BIAS = 0.5
# ITL's load part alone can be off by more (a single shape lets the fit put most of ITL into
# alpha): its factor (1 + error) is bounded to these.
MIN_LOAD_FACTOR, MAX_LOAD_FACTOR = 0.25, 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Forecast:
    """The bias-corrected model of one deployment: replicas for a total rate, and latencies
    (ms) at a per-replica rate (req/s)."""

    plan: ReplicaPlan
    ttft_ms: float
    itl_ms: float
    stable: bool
    saturation_rate_per_replica_rps: float
    percentiles: tuple[PredictedPercentile, ...]  # each percentile target's, at the same rate


def forecast(
    dep: DeploymentConfig,
    params: ServiceParams,
    workload: Workload,
    bias: ModelBias | tuple[float, float] | None,
    *,
    size_for_rps: float,
    per_replica_rps: float,
    inputs: ModelInputs | None = None,
    shortfalls: Mapping[PercentileTarget, float] | None = None,
) -> Forecast:
    """Size for a total rate and predict at a per-replica rate, the means corrected for the
    model's median relative error (TTFT, ITL, or ITL's load part: `ModelBias`) on recent
    windows, or ITL read from the bias's ITL curve when it has one (the estimate's plan for
    TTFT and the percentiles, the curve's for ITL: the tighter holds); the percentiles as
    predicted (the mean bias factor is not applied to tails); `inputs` (default: the
    configured options and server) carry the measured traffic shape; `shortfalls` tighten
    percentile targets whose observed attainment fell short of the model's
    (exporter.sizing.attainment)."""
    inputs = inputs or ModelInputs(dep.model, dep.server)
    options, server = inputs.options, inputs.server
    curve = bias.itl_curve if isinstance(bias, ModelBias) else None
    # prediction / factor is the corrected prediction, so a target T is met where the raw
    # prediction stays within T x factor.
    f_ttft = 1.0 if bias is None else _factor(bias[0])
    light, f_itl, itl_target = 0.0, 1.0, None  # with a curve, the estimate does not size ITL
    if curve is None:
        light, f_itl = _itl_correction(params, workload, bias, inputs)
        itl_target = dep.slo.itl_ms
    plan = replicas_for_slo(
        size_for_rps,
        params,
        server,
        workload,
        None if dep.slo.ttft_ms is None else dep.slo.ttft_ms * f_ttft,
        None if itl_target is None else light + (itl_target - light) * f_itl,
        min_replicas=dep.serving_min_replicas,
        options=options,
        percentiles=tightened(dep.slo.percentiles, shortfalls or {}),
    )
    if curve is not None and dep.slo.itl_ms is not None:
        by_itl = replicas_for_slo(
            size_for_rps, curve, server, workload, None, dep.slo.itl_ms,
            min_replicas=dep.serving_min_replicas, options=options,
        )  # fmt: skip
        plan = min(plan, by_itl, key=lambda p: p.capacity.rate_rps)
    at = analyze(params, server, workload, per_replica_rps, options=options)
    at_itl = at
    if curve is not None:
        at_itl = analyze(curve, server, workload, per_replica_rps, options=options)
    return Forecast(
        plan=plan,
        ttft_ms=float(at.ttft_ms) / f_ttft,
        itl_ms=light + (float(at_itl.itl_ms) - light) / f_itl,
        stable=bool(at.stable),
        saturation_rate_per_replica_rps=float(at.saturation_rate_rps),
        percentiles=predicted_percentiles(
            dep.slo.percentiles, params, server, workload, per_replica_rps, options
        ),
    )


def _itl_correction(
    params: ServiceParams,
    workload: Workload,
    bias: ModelBias | tuple[float, float] | None,
    inputs: ModelInputs,
) -> tuple[float, float]:
    """(light ms, factor): the estimate's ITL corrected as light + (raw - light) / factor, so a
    target T is met where raw <= light + (T - light) x factor. With the error of ITL's load part
    known only that part is corrected (light: the ITL at an empty engine), else all of ITL."""
    load = bias.itl_load if isinstance(bias, ModelBias) else None
    if load is None:
        return 0.0, 1.0 if bias is None else _factor(bias[1])
    empty = analyze(params, inputs.server, workload, LIGHT_RATE_RPS, options=inputs.options)
    return float(empty.itl_ms), min(max(1.0 + load, MIN_LOAD_FACTOR), MAX_LOAD_FACTOR)


def _factor(bias: float) -> float:
    return 1.0 + min(max(bias, -MAX_BIAS), MAX_BIAS)
