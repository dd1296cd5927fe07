"""The bias-corrected model of one deployment: replicas for a total rate, latencies at a
per-replica rate. Shared by the recommender, scale from zero and the what-if API."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.config import DeploymentConfig
from exporter.traffic import ModelInputs
from model import ReplicaPlan, ServiceParams, Workload, analyze, replicas_for_slo

# Bias corrections are bounded: a larger error means the estimate is wrong, not biased.
MAX_BIAS = 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class Forecast:
    """The bias-corrected model of one deployment: replicas for a total rate, and latencies
    (ms) at a per-replica rate (req/s)."""

    plan: ReplicaPlan
    ttft_ms: float
    itl_ms: float
    stable: bool
    saturation_rate_per_replica_rps: float


def forecast(
    dep: DeploymentConfig,
    params: ServiceParams,
    workload: Workload,
    bias: tuple[float, float] | None,
    *,
    size_for_rps: float,
    per_replica_rps: float,
    inputs: ModelInputs | None = None,
) -> Forecast:
    """Size for a total rate and predict at a per-replica rate, corrected for the model's
    mean relative error (TTFT, ITL) on recent windows; `inputs` (default: the configured
    options and server) carry the measured traffic shape."""
    inputs = inputs or ModelInputs(dep.model, dep.server)
    options, server = inputs.options, inputs.server
    # prediction / factor is the corrected prediction, so a target T is met where the raw
    # prediction stays within T x factor.
    f_ttft, f_itl = (1.0, 1.0) if bias is None else (_factor(bias[0]), _factor(bias[1]))
    plan = replicas_for_slo(
        size_for_rps,
        params,
        server,
        workload,
        None if dep.slo.ttft_ms is None else dep.slo.ttft_ms * f_ttft,
        None if dep.slo.itl_ms is None else dep.slo.itl_ms * f_itl,
        min_replicas=dep.serving_min_replicas,
        options=options,
    )
    at = analyze(params, server, workload, per_replica_rps, options=options)
    return Forecast(
        plan=plan,
        ttft_ms=float(at.ttft_ms) / f_ttft,
        itl_ms=float(at.itl_ms) / f_itl,
        stable=bool(at.stable),
        saturation_rate_per_replica_rps=float(at.saturation_rate_rps),
    )


def _factor(bias: float) -> float:
    return 1.0 + min(max(bias, -MAX_BIAS), MAX_BIAS)
