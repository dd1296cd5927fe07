"""The answer of /api/v1/predict: the model at a what-if load, as JSON in seconds."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from exporter.config.values import DeploymentConfig
from exporter.sizing.feasibility import infeasible_at_max
from exporter.sizing.forecast import forecast
from exporter.sizing.slo_targets import (
    BindingTarget,
    PredictedPercentile,
    binding_target,
    percentile_label,
)
from exporter.sizing.traffic import ModelInputs
from model import LatencyMetric, LatencyQuantiles, ServiceParams, Workload, latency_quantiles
from model.calibration.trust import ModelBias

S_PER_MS = 1e-3
# Percentiles a query may ask for: the model's range (quantiles 0.01 to 0.999).
MIN_PERCENTILE = 1.0
MAX_PERCENTILE = 99.9


@dataclass(frozen=True, slots=True, kw_only=True)
class WhatIf:
    """A what-if prediction for one deployment at a given total rate; ms and req/s."""

    deployment: str
    total_rate_rps: float
    replicas: int
    per_replica_rate_rps: float
    ttft_ms: float
    itl_ms: float
    stable: bool
    max_rate_per_replica_rps: float
    saturation_rate_per_replica_rps: float
    replicas_needed: int | None
    feasible: bool  # at some load
    max_replicas: int
    params: dict[str, float]
    binding_target: BindingTarget | None = None
    # The configured percentile targets' percentiles at the per-replica rate (no bias factor).
    targets: tuple[PredictedPercentile, ...] = ()
    quantiles: LatencyQuantiles | None = None  # the percentiles the query asked for
    # The targets the model misses at replicas.max at this total rate (exporter.sizing.feasibility).
    infeasible_targets: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """JSON-safe, in seconds; an unstable prediction's latencies are null."""
        return {
            "deployment": self.deployment,
            "rate_requests_per_second": self.total_rate_rps,
            "replicas": self.replicas,
            "per_replica_rate_requests_per_second": self.per_replica_rate_rps,
            "stable": self.stable,
            "ttft_seconds": _seconds(self.ttft_ms),
            "itl_seconds": _seconds(self.itl_ms),
            "max_rate_per_replica_requests_per_second": self.max_rate_per_replica_rps,
            "saturation_rate_per_replica_requests_per_second": self.saturation_rate_per_replica_rps,
            "replicas_needed": self.replicas_needed,
            "slo_feasible": self.feasible,
            "max_replicas": self.max_replicas,
            "infeasible_targets": list(self.infeasible_targets),
            "binding_target": None if self.binding_target is None else self.binding_target.value,
            "percentile_targets": [_target(p) for p in self.targets],
            "percentiles": _quantiles(self.quantiles),
            "params_seconds": {k.removesuffix("_ms"): v * S_PER_MS for k, v in self.params.items()},
        }


def what_if(
    dep: DeploymentConfig,
    params: ServiceParams,
    workload: Workload,
    bias: ModelBias | tuple[float, float] | None,
    rate_rps: float,
    replicas: int,
    quantiles: tuple[float, ...],
    inputs: ModelInputs | None = None,
) -> WhatIf:
    """The bias-corrected model at a total rate (req/s) on `replicas`, with the model's
    percentiles at `quantiles` (none: not computed); `inputs` as for `forecast`."""
    per_replica = rate_rps / replicas
    inputs = inputs or ModelInputs(dep.model, dep.server)
    outlook = forecast(
        dep, params, workload, bias, size_for_rps=rate_rps, per_replica_rps=per_replica,
        inputs=inputs,
    )  # fmt: skip
    asked = None
    if quantiles:
        asked = latency_quantiles(
            params, inputs.server, workload, per_replica, quantiles, options=inputs.options
        )
    return WhatIf(
        deployment=dep.name,
        total_rate_rps=rate_rps,
        replicas=replicas,
        per_replica_rate_rps=per_replica,
        ttft_ms=outlook.ttft_ms,
        itl_ms=outlook.itl_ms,
        stable=outlook.stable,
        max_rate_per_replica_rps=outlook.plan.capacity.rate_rps,
        saturation_rate_per_replica_rps=outlook.saturation_rate_per_replica_rps,
        replicas_needed=outlook.plan.replicas,
        feasible=outlook.plan.capacity.feasible,
        max_replicas=dep.max_replicas,
        infeasible_targets=infeasible_at_max(
            dep, params, workload, bias, total_rps=rate_rps, needed=outlook.plan.replicas,
            inputs=inputs,
        ),
        params=params.to_dict(),
        binding_target=binding_target(outlook.plan.capacity),
        targets=outlook.percentiles,
        quantiles=asked,
    )


def _seconds(ms: float) -> float | None:
    return ms * S_PER_MS if math.isfinite(ms) else None


def _target(p: PredictedPercentile) -> dict[str, Any]:
    return {
        "target": p.target.name,
        "metric": p.target.metric.value,
        "percentile": percentile_label(p.target.quantile),
        "target_seconds": p.target.target_ms * S_PER_MS,
        "predicted_seconds": _seconds(p.value_ms),
        "predicted_attainment": p.attainment,
        "met": p.value_ms <= p.target.target_ms,
    }


def _quantiles(q: LatencyQuantiles | None) -> dict[str, dict[str, float | None]]:
    """{'95': {'ttft_seconds': ..., 'itl_per_token_seconds': ..., ...}, ...}."""
    if q is None:
        return {}
    columns = {
        LatencyMetric.TTFT: q.ttft_ms,
        LatencyMetric.ITL_PER_TOKEN: q.itl_per_token_ms,
        LatencyMetric.ITL_PER_REQUEST: q.itl_per_request_ms,
    }
    return {
        percentile_label(float(quantile)): {
            f"{metric.value}_seconds": _seconds(float(values[k]))
            for metric, values in columns.items()
        }
        for k, quantile in enumerate(q.quantiles)
    }
