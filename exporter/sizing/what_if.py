"""The answer of /api/v1/predict: the model at a what-if load, as JSON in seconds, computed from
one deployment's published estimate (`ServedEstimate`) alone."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from exporter.config.values import DeploymentConfig
from exporter.sizing.evidence import EXTRAPOLATED_RATIO, bounded, envelope, latency_floor_ms
from exporter.sizing.feasibility import infeasible_at_max
from exporter.sizing.forecast import forecast
from exporter.sizing.slo_targets import (
    BindingTarget,
    PredictedPercentile,
    binding_target,
    percentile_label,
)
from exporter.sizing.traffic import ModelInputs
from model import (
    LatencyMetric,
    LatencyQuantiles,
    Observation,
    ServiceParams,
    Workload,
    latency_quantiles,
)
from model.calibration.estimate import TunerEstimate
from model.calibration.trust import ModelBias

S_PER_MS = 1e-3
# Percentiles a query may ask for: the model's range (quantiles 0.01 to 0.999).
MIN_PERCENTILE = 1.0
MAX_PERCENTILE = 99.9
MIN_MODEL_RATE_RPS = 1e-9  # a request in 30 years: at or below it, the latencies at rest


@dataclass(frozen=True, slots=True, kw_only=True)
class WhatIf:
    """A what-if prediction for one deployment at a given total rate; ms and req/s."""

    deployment: str
    total_rate_rps: float
    replicas: int
    per_replica_rate_rps: float
    ttft_ms: float
    itl_ms: float
    # None: beyond the saturation the windows support, where they identify nothing
    # (exporter.sizing.evidence: the latencies are then not answered either).
    stable: bool | None
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
    # The per-replica rates the calibration's windows observed (None: none), and how far the
    # per-replica rate lies outside them (1 within; `exporter.sizing.evidence`).
    observed_rps: tuple[float, float] | None = None
    extrapolation_ratio: float | None = None

    @property
    def extrapolated(self) -> bool:
        """The prediction is made beyond the observed rates (or with none observed)."""
        ratio = self.extrapolation_ratio
        return ratio is None or ratio > EXTRAPOLATED_RATIO
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
            "extrapolated": self.extrapolated,
            "extrapolation_ratio": self.extrapolation_ratio,
            "observed_rate_per_replica_requests_per_second": None
            if self.observed_rps is None
            else {"low": self.observed_rps[0], "high": self.observed_rps[1]},
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ServedEstimate:
    """What one deployment's what-if is computed from, published once per cycle: the tuner's
    estimate, the request shape sized for, the model's inputs for the measured traffic and the
    replicas the last decision saw."""

    config: DeploymentConfig
    tuner: TunerEstimate
    workload: Workload | None
    inputs: ModelInputs | None
    current_replicas: int | None
    slope_known: bool = True  # DeploymentCycle.slope_known


def predict(
    served: ServedEstimate, rate_rps: float, replicas: int | None, quantiles: tuple[float, ...]
) -> WhatIf:
    """`what_if` at a total rate (req/s) on `replicas` (None: the current count, else 1), from
    `served` alone; LookupError while it has no parameters or request shape."""
    params, workload = served.tuner.params, served.workload
    if params is None or workload is None:
        raise LookupError(f"deployment {served.config.name!r} has no calibrated model yet")
    count = replicas or served.current_replicas or 1
    return what_if(
        served.config, params, workload, served.tuner.bias, rate_rps, count, quantiles,
        served.inputs, served.tuner.window, slope_known=served.slope_known,
    )  # fmt: skip


def what_if(
    dep: DeploymentConfig,
    params: ServiceParams,
    workload: Workload,
    bias: ModelBias | tuple[float, float] | None,
    rate_rps: float,
    replicas: int,
    quantiles: tuple[float, ...],
    inputs: ModelInputs | None = None,
    evidence: Sequence[Observation] = (),
    *,
    slope_known: bool = True,
) -> WhatIf:
    """The bias-corrected model at a total rate (req/s) on `replicas`, with the model's
    percentiles at `quantiles` (none: not computed); `inputs` as for `forecast`; capacity,
    saturation, count and latencies within what the `evidence` windows (per replica) show
    (`exporter.sizing.evidence`): without `slope_known` (how latency grows with load known
    beyond them), no claim past what they identified (`Envelope.claim`)."""
    per_replica = rate_rps / replicas
    # Below MIN_MODEL_RATE_RPS the model's ratios of vanishing quantities lose every digit
    # (1e-320 req/s gave a mean ITL of 8e20 s); the idle engine's latencies are exact there.
    model_total, model_rate = (
        (rate_rps, per_replica) if per_replica >= MIN_MODEL_RATE_RPS else (0.0, 0.0)
    )
    inputs = inputs or ModelInputs(dep.model, dep.server)
    outlook = forecast(
        dep, params, workload, bias, size_for_rps=model_total, per_replica_rps=model_rate,
        inputs=inputs,
    )  # fmt: skip
    env = envelope(evidence, dep.slo)
    checked = bounded(outlook, rate_rps, env, slope_known=slope_known)
    ttft_ms, itl_ms = latency_floor_ms(per_replica, outlook.ttft_ms, outlook.itl_ms, env)
    stable: bool | None = outlook.stable
    needed = checked.replicas
    claimed = checked.claimed_rps
    if claimed < checked.capacity_rps:
        # The published capacity is the windows' (a count from the model's would contradict it).
        needed = min(max(1, math.ceil(rate_rps / claimed - 1e-9)), dep.max_replicas)
    beyond = per_replica > checked.claimed_saturation_rps * EXTRAPOLATED_RATIO
    if checked.unidentified and beyond:
        # Past the saturation the windows support, with how latency grows unidentified: the
        # model's latencies there are a guess no window tested (module docstring of evidence).
        ttft_ms, itl_ms, stable = math.inf, math.inf, None
    low, high = env.low_rps, env.high_rps
    observed = None if low is None or high is None else (low, high)
    asked = None
    if quantiles:
        asked = latency_quantiles(
            params, inputs.server, workload, model_rate, quantiles, options=inputs.options
        )
    return WhatIf(
        deployment=dep.name,
        total_rate_rps=rate_rps,
        replicas=replicas,
        per_replica_rate_rps=per_replica,
        ttft_ms=ttft_ms,
        itl_ms=itl_ms,
        stable=stable,
        max_rate_per_replica_rps=claimed,
        saturation_rate_per_replica_rps=checked.claimed_saturation_rps,
        replicas_needed=needed,
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
        observed_rps=observed,
        extrapolation_ratio=env.extrapolation_ratio(per_replica),
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
