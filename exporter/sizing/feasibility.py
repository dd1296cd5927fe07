"""Which targets the model cannot meet at replicas.max: a target is reported infeasible only then.

A target is infeasible at a total rate when the model, sized for that target alone (with the
same bias corrections, traffic shape and tightened percentiles as the recommendation), needs
more than replicas.max replicas for it, or cannot meet it at any load. The check runs only
when the joint plan does not fit within replicas.max: otherwise every target is met there.

For per-token ITL percentiles the tail is often set by the steps that carry a prefill chunk,
not by queueing: `prefill_step_ms` is how long such a step lasts at light load, so a target
below it is met only while fewer than 1 - q of the gaps fall in such steps (a light load per
replica, many replicas).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from exporter.config.values import DeploymentConfig, SloConfig
from exporter.sizing.forecast import forecast
from exporter.sizing.traffic import ModelInputs
from model import PercentileTarget, ServerConfig, ServiceParams, Workload
from model.calibration.trust import ModelBias

TTFT_MEAN = "ttft_mean"
ITL_MEAN = "itl_mean"


def single_targets(slo: SloConfig) -> tuple[tuple[str, SloConfig], ...]:
    """Each configured target by name ('ttft_mean', 'itl_mean', 'ttft_p95', ...), alone."""
    out: list[tuple[str, SloConfig]] = []
    if slo.ttft_ms is not None:
        out.append((TTFT_MEAN, SloConfig(ttft_ms=slo.ttft_ms, window_s=slo.window_s)))
    if slo.itl_ms is not None:
        out.append((ITL_MEAN, SloConfig(itl_ms=slo.itl_ms, window_s=slo.window_s)))
    for target in slo.percentiles:
        out.append((target.name, SloConfig(percentiles=(target,), window_s=slo.window_s)))
    return tuple(out)


def target_names(
    ttft_ms: float | None, itl_ms: float | None, percentiles: Sequence[PercentileTarget]
) -> tuple[str, ...]:
    """The names of the configured targets, in `single_targets` order."""
    means = [n for n, t in ((TTFT_MEAN, ttft_ms), (ITL_MEAN, itl_ms)) if t is not None]
    return (*means, *(t.name for t in percentiles))


def infeasible_at_max(
    dep: DeploymentConfig,
    params: ServiceParams,
    workload: Workload,
    bias: ModelBias | tuple[float, float] | None,
    *,
    total_rps: float,
    needed: int | None,
    inputs: ModelInputs | None = None,
    shortfalls: Mapping[PercentileTarget, float] | None = None,
) -> tuple[str, ...]:
    """The targets the model misses at dep.max_replicas at a total rate (req/s); `needed` is
    the joint plan's count (None: not at any count), and none are when it fits."""
    if needed is not None and needed <= dep.max_replicas:
        return ()
    out = []
    for name, slo in single_targets(dep.slo):
        plan = forecast(
            replace(dep, slo=slo), params, workload, bias, size_for_rps=total_rps,
            per_replica_rps=total_rps / dep.max_replicas, inputs=inputs, shortfalls=shortfalls,
        ).plan  # fmt: skip
        if plan.replicas is None or plan.replicas > dep.max_replicas:
            out.append(name)
    return tuple(out)


def prefill_step_ms(params: ServiceParams, server: ServerConfig, workload: Workload) -> float:
    """How long a step carrying one prompt's prefill chunk (at most the token budget) lasts
    beside a single decoding request, ms: alpha + beta x (chunk + 1) + gamma x the KV read."""
    chunk = min(workload.avg_input_tokens, float(server.max_num_batched_tokens))
    kv_tokens = workload.avg_input_tokens + workload.avg_output_tokens / 2.0
    return params.alpha_ms + params.beta_ms * (chunk + 1.0) + params.gamma_ms * kv_tokens
