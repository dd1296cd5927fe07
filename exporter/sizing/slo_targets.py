"""What the recommender reports about percentile targets: which target binds the SLO capacity,
and the model's percentiles at the current load. Percentile targets are sized on the model as
it is: the mean bias factor corrects mean predictions and is not applied to tails."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from model import (
    Binding,
    FirstToken,
    LatencyMetric,
    ModelOptions,
    PercentileTarget,
    ServerConfig,
    ServiceParams,
    SloCapacity,
    Workload,
)
from model.queueing.chain import workload_table
from model.queueing.percentile_sizing import target_percentiles
from model.queueing.percentiles import MAX_QUANTILE


class BindingTarget(StrEnum):
    """Which target sets a replica's SLO capacity; exported label values."""

    TTFT_MEAN = "ttft_mean"
    ITL_MEAN = "itl_mean"
    TTFT_PERCENTILE = "ttft_percentile"
    ITL_PER_TOKEN_PERCENTILE = "itl_per_token_percentile"
    ITL_PER_REQUEST_PERCENTILE = "itl_per_request_percentile"
    MAX_RATE = "max_rate"  # no target binds below the rate at which the queue saturates


_PERCENTILE_BINDING = {
    LatencyMetric.TTFT: BindingTarget.TTFT_PERCENTILE,
    LatencyMetric.ITL_PER_TOKEN: BindingTarget.ITL_PER_TOKEN_PERCENTILE,
    LatencyMetric.ITL_PER_REQUEST: BindingTarget.ITL_PER_REQUEST_PERCENTILE,
}
_MEAN_BINDING = {
    Binding.TTFT: BindingTarget.TTFT_MEAN,
    Binding.ITL: BindingTarget.ITL_MEAN,
    Binding.CAPACITY: BindingTarget.MAX_RATE,
}


def binding_target(capacity: SloCapacity) -> BindingTarget:
    """The kind of target that binds `capacity` (for an infeasible one: the target missed)."""
    if capacity.binding_target is not None:
        return _PERCENTILE_BINDING[capacity.binding_target.metric]
    return _MEAN_BINDING[capacity.binding]


@dataclass(frozen=True, slots=True)
class PredictedPercentile:
    """The model's value (ms; +inf when the load saturates) of a target's percentile, and the
    share of requests (of gaps, for per-token ITL) it predicts within the target."""

    target: PercentileTarget
    value_ms: float
    attainment: float


def predicted_percentiles(
    targets: Sequence[PercentileTarget],
    params: ServiceParams,
    server: ServerConfig,
    workload: Workload,
    rate_rps: float,
    options: ModelOptions,
) -> tuple[PredictedPercentile, ...]:
    """Each target's percentile and attainment predicted at a per-replica rate (req/s): one
    model evaluation for all of them, none without targets."""
    if not targets:
        return ()
    table = workload_table(params, server, workload, options=options)
    found = target_percentiles(
        params, server, workload, table, targets, FirstToken.AFTER_DECODE_ITERATION, rate_rps
    )
    pairs = zip(targets, found, strict=True)
    return tuple(PredictedPercentile(t, value, share) for t, (value, share) in pairs)


def tightened(
    targets: Sequence[PercentileTarget], shortfalls: Mapping[PercentileTarget, float]
) -> tuple[PercentileTarget, ...]:
    """The targets to size on: each whose observed attainment fell short of the model's by s
    asks the model for s more (0.95 -> 0.99 for a 4-point shortfall, at most MAX_QUANTILE)."""
    return tuple(
        replace(t, quantile=min(t.quantile + shortfalls[t], MAX_QUANTILE))
        if shortfalls.get(t, 0.0) > 0
        else t
        for t in targets
    )


def percentile_label(quantile: float) -> str:
    """The `percentile` label value of a quantile: '95' for 0.95, '99.9' for 0.999."""
    return f"{round(quantile * 100, 6):g}"
