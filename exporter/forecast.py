"""The bias-corrected model of one deployment: replicas for a total rate, latencies at a
per-replica rate. Shared by the recommender, scale from zero and the what-if API."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from exporter.config import DeploymentConfig
from exporter.slo_targets import PredictedPercentile, predicted_percentiles, tightened
from exporter.traffic import ModelInputs
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
    windows, the percentiles as predicted (the mean bias factor is not applied to tails);
    `inputs` (default: the configured options and server) carry the measured traffic shape;
    `shortfalls` tighten percentile targets whose observed attainment fell short of the
    model's (exporter.attainment)."""
    inputs = inputs or ModelInputs(dep.model, dep.server)
    options, server = inputs.options, inputs.server
    # prediction / factor is the corrected prediction, so a target T is met where the raw
    # prediction stays within T x factor.
    f_ttft, f_itl = (1.0, 1.0) if bias is None else (_factor(bias[0]), _factor(bias[1]))
    # With the error of ITL's load part known, only that part is corrected: light + (raw -
    # light) / factor, met where raw <= light + (T - light) x factor.
    load = None if not isinstance(bias, ModelBias) else bias.itl_load
    light = 0.0
    if load is not None:
        f_itl = min(max(1.0 + load, MIN_LOAD_FACTOR), MAX_LOAD_FACTOR)
        light = float(analyze(params, server, workload, LIGHT_RATE_RPS, options=options).itl_ms)
    plan = replicas_for_slo(
        size_for_rps,
        params,
        server,
        workload,
        None if dep.slo.ttft_ms is None else dep.slo.ttft_ms * f_ttft,
        None if dep.slo.itl_ms is None else light + (dep.slo.itl_ms - light) * f_itl,
        min_replicas=dep.serving_min_replicas,
        options=options,
        percentiles=tightened(dep.slo.percentiles, shortfalls or {}),
    )
    at = analyze(params, server, workload, per_replica_rps, options=options)
    return Forecast(
        plan=plan,
        ttft_ms=float(at.ttft_ms) / f_ttft,
        itl_ms=light + (float(at.itl_ms) - light) / f_itl,
        stable=bool(at.stable),
        saturation_rate_per_replica_rps=float(at.saturation_rate_rps),
        percentiles=predicted_percentiles(
            dep.slo.percentiles, params, server, workload, per_replica_rps, options
        ),
    )


def _factor(bias: float) -> float:
    return 1.0 + min(max(bias, -MAX_BIAS), MAX_BIAS)
