"""SLO capacity of one replica and the replica count for a total load. Spec §8, §9.

Search semantics are the spec's "clean" ones, not the Go bisection's: per target, the largest
rate in [0.001 / tau(1), MaxRate = 0.999 B / tau(B)] up to which the metric stays within it (the
first crossing from below); a target missed at the low end is infeasible. The capacity is the
least of the TTFT rate, the ITL rate and MaxRate. A grid scan finds the first crossing even
where chunk-count steps make ITL saw-toothed (T_p jumps up and ITL down where round(X-bar)
crosses a chunk breakpoint; spec §6), then the bracket is subdivided until it is far narrower
than the 1e-5 accuracy asked for (compiled: model/queueing/kernel/sizing.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

from model.queueing.analyzer import MAX_RATE_FRACTION, Analysis, analyze_table
from model.queueing.chain import StateTable, workload_table
from model.queueing.kernel import mean as kernel_mean
from model.queueing.kernel import sizing as kernel_sizing
from model.queueing.params import ServerConfig, ServiceParams, Workload
from model.queueing.percentile_sizing import (
    PercentileTarget,
    attainment_at,
    percentile_crossing,
)
from model.queueing.percentiles import FirstToken, LatencyMetric
from model.queueing.validation import (
    require_int_at_least,
    require_non_negative,
    require_optional_target,
)
from model.queueing.variant import DEFAULT_MODEL, ModelOptions

# Lower end of the search, as a fraction of the single-request service rate (Go `RateRange.Min`).
MIN_RATE_FRACTION = 1e-3
SCAN_POINTS = 48  # first pass over [min, MaxRate]
REFINE_POINTS = 32  # points per bracket in each refinement pass
DENSE_SCAN_POINTS = 512  # second look where chunk steps can hide a crossing
MAX_TEETH = 16  # chunk-count steps checked one by one (more: the dense scan alone)
REFINE_REL_WIDTH = 1e-7  # stop when the bracket is this narrow relative to its lower end
# Replica counts are ceil(total / capacity); forgive float noise in an exact multiple.
CEIL_SLACK = 1e-9


class Binding(StrEnum):
    """Which limit sets the SLO capacity."""

    TTFT = "ttft"
    ITL = "itl"
    CAPACITY = "capacity"


class SizingStatus(StrEnum):
    """Outcome of a sizing question; values are exported label values."""

    OK = "ok"
    TTFT_INFEASIBLE = "ttft_infeasible"
    ITL_INFEASIBLE = "itl_infeasible"
    MAX_REPLICAS_EXCEEDED = "max_replicas_exceeded"


SIZING_MESSAGES: dict[SizingStatus, str] = {
    SizingStatus.OK: "targets met",
    SizingStatus.TTFT_INFEASIBLE: "the TTFT target is missed even at the lightest load",
    SizingStatus.ITL_INFEASIBLE: "the ITL target is missed even at the lightest load",
    SizingStatus.MAX_REPLICAS_EXCEEDED: "more replicas are needed than max_replicas allows",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class SloCapacity:
    """Largest per-replica rate (req/s) meeting every given target. Spec §8."""

    feasible: bool
    status: SizingStatus
    message: str
    rate_rps: float  # 0.0 when infeasible
    binding: Binding
    rate_ttft_rps: float  # MaxRate when no TTFT target; 0.0 when the target is infeasible
    rate_itl_rps: float
    max_rate_rps: float
    min_rate_rps: float
    analysis: Analysis  # the model at rate_rps (at the lowest searched rate when infeasible)
    # Percentile targets (sizing with `percentiles`): the one that binds, else None, and each
    # target's attainment at rate_rps (at the lowest searched rate when infeasible).
    binding_target: PercentileTarget | None = None
    attainment: tuple[float, ...] = ()

    @property
    def binding_name(self) -> str:
        """The binding target by name: 'ttft_p95', 'itl_per_token_p99', ... for a percentile
        target, 'ttft_mean' or 'itl_mean' for a mean one, 'max_rate' for the capacity."""
        if self.binding_target is not None:
            return self.binding_target.name
        return {Binding.TTFT: "ttft_mean", Binding.ITL: "itl_mean"}.get(self.binding, "max_rate")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaPlan:
    """Replicas for a total load and the per-replica prediction at that count. Spec §9."""

    feasible: bool
    status: SizingStatus
    message: str
    replicas: int | None  # None when the targets cannot be met at any load
    total_rate_rps: float
    per_replica_rate_rps: float | None
    ttft_ms: float | None  # predicted per replica at `replicas`
    itl_ms: float | None
    capacity: SloCapacity


# The kernel's output row of each target, the TTFT's by its first-token convention.
_TTFT_ROWS = {
    FirstToken.AFTER_DECODE_ITERATION: kernel_mean.TTFT,
    FirstToken.WITH_LAST_CHUNK: kernel_mean.TTFT_CHUNK,
}
# kernel_sizing.crossings' search grid.
_GRID = np.array([SCAN_POINTS, REFINE_POINTS, DENSE_SCAN_POINTS, MAX_TEETH])


def _first_crossing(
    table: StateTable, lo: float, hi: float, targets: dict[str, float], first_token: FirstToken
) -> dict[str, float | None]:
    """Per metric: the largest rate in [lo, hi] up to which metric <= target, or None if
    the target is missed already at lo. A scan of [lo, hi] then the bracket of the first
    crossing refined; where chunk-count steps make ITL saw-toothed, an excursion over the
    target can hide between two scan points: a dense scan below the rate found, and a look
    just below each step (an excursion can be narrower than the dense grid). Compiled, one
    call for every target: model/queueing/kernel/sizing.py."""
    rows = {"ttft_ms": _TTFT_ROWS[first_token], "itl_ms": kernel_mean.ITL}
    metrics = np.array([rows[name] for name in targets])
    values = np.array(list(targets.values()), dtype=np.float64)
    rates, feasible = kernel_sizing.crossings(
        table.states, table.row_values, table.kernel_options, metrics, values, lo, hi, _GRID,
        REFINE_REL_WIDTH,
    )  # fmt: skip
    return {
        name: float(rate) if ok else None
        for name, rate, ok in zip(targets, rates.tolist(), feasible.tolist(), strict=True)
    }


def max_rate_for_slo(
    params: ServiceParams,
    server: ServerConfig,
    workload: Workload,
    ttft_ms: float | None = None,
    itl_ms: float | None = None,
    *,
    options: ModelOptions = DEFAULT_MODEL,
    percentiles: Sequence[PercentileTarget] = (),
    first_token: FirstToken = FirstToken.AFTER_DECODE_ITERATION,
) -> SloCapacity:
    """Largest per-replica rate (req/s) whose mean TTFT and ITL (ms) stay within the given
    targets and at which every percentile target is attained (model/queueing/percentile_sizing.py).
    `first_token` is the convention of every TTFT target, the mean's (Analysis.ttft_ms or
    ttft_with_last_chunk_ms) and the percentiles'. Without percentile targets this is the
    mean-only search, unchanged."""
    ttft_target = require_optional_target("ttft_ms", ttft_ms)
    itl_target = require_optional_target("itl_ms", itl_ms)
    first = FirstToken(first_token)
    table = workload_table(params, server, workload, options=options)
    capacity = slo_capacity(table, ttft_target, itl_target, first)
    if not percentiles:
        return capacity
    return with_percentiles(
        capacity, params, server, workload, table, _targets(percentiles), first
    )


def _targets(percentiles: Sequence[PercentileTarget]) -> tuple[PercentileTarget, ...]:
    targets = tuple(percentiles)
    for target in targets:
        if not isinstance(target, PercentileTarget):
            raise ValueError(f"`percentiles` must hold PercentileTarget values, got {target!r}")
    return targets


def with_percentiles(
    capacity: SloCapacity,
    params: ServiceParams,
    server: ServerConfig,
    workload: Workload,
    table: StateTable,
    targets: tuple[PercentileTarget, ...],
    first_token: FirstToken,
) -> SloCapacity:
    """The mean-target capacity lowered to where the percentile targets stop being met."""
    if not capacity.feasible:
        return capacity
    found = percentile_crossing(
        params, server, workload, table, targets, first_token,
        capacity.min_rate_rps, capacity.max_rate_rps,
    )
    if found.rate_rps is None:
        assert found.binding is not None
        ttft = found.binding.metric is LatencyMetric.TTFT
        status = SizingStatus.TTFT_INFEASIBLE if ttft else SizingStatus.ITL_INFEASIBLE
        return replace(
            capacity,
            feasible=False,
            status=status,
            message=SIZING_MESSAGES[status],
            rate_rps=0.0,
            binding=Binding.TTFT if ttft else Binding.ITL,
            analysis=analyze_table(table, np.asarray(capacity.min_rate_rps)),
            binding_target=found.binding,
            attainment=found.attainment,
        )
    if found.rate_rps >= capacity.rate_rps:
        # The mean targets (or the capacity) bind: report the attainment at their rate.
        at = attainment_at(
            params, server, workload, table, targets, first_token, capacity.rate_rps
        )
        return replace(capacity, attainment=at)
    assert found.binding is not None
    ttft = found.binding.metric is LatencyMetric.TTFT
    return replace(
        capacity,
        rate_rps=found.rate_rps,
        binding=Binding.TTFT if ttft else Binding.ITL,
        analysis=analyze_table(table, np.asarray(found.rate_rps)),
        binding_target=found.binding,
        attainment=found.attainment,
    )


def slo_capacity(
    table: StateTable,
    ttft_target: float | None,
    itl_target: float | None,
    first_token: FirstToken = FirstToken.AFTER_DECODE_ITERATION,
) -> SloCapacity:
    """`max_rate_for_slo` on a precomputed state table (targets already validated)."""
    sat_rps = float(table.saturation_rate_per_ms[0]) * 1000.0
    hi = MAX_RATE_FRACTION * sat_rps
    lo = MIN_RATE_FRACTION * 1000.0 / float(table.tau_ms[0, 0])
    targets = {
        name: value
        for name, value in (("ttft_ms", ttft_target), ("itl_ms", itl_target))
        if value is not None
    }
    found = _first_crossing(table, lo, hi, targets, first_token) if targets else {}
    rate_ttft = found.get("ttft_ms", hi) if "ttft_ms" in targets else hi
    rate_itl = found.get("itl_ms", hi) if "itl_ms" in targets else hi
    if rate_ttft is None or rate_itl is None:
        status = SizingStatus.TTFT_INFEASIBLE if rate_ttft is None else SizingStatus.ITL_INFEASIBLE
        binding = Binding.TTFT if rate_ttft is None else Binding.ITL
        return SloCapacity(
            feasible=False,
            status=status,
            message=SIZING_MESSAGES[status],
            rate_rps=0.0,
            binding=binding,
            rate_ttft_rps=0.0 if rate_ttft is None else rate_ttft,
            rate_itl_rps=0.0 if rate_itl is None else rate_itl,
            max_rate_rps=hi,
            min_rate_rps=lo,
            analysis=analyze_table(table, np.asarray(lo)),
        )
    rate = min(rate_ttft, rate_itl, hi)
    if rate >= hi:
        binding = Binding.CAPACITY
    elif rate == rate_ttft:
        binding = Binding.TTFT
    else:
        binding = Binding.ITL
    return SloCapacity(
        feasible=True,
        status=SizingStatus.OK,
        message=SIZING_MESSAGES[SizingStatus.OK],
        rate_rps=rate,
        binding=binding,
        rate_ttft_rps=rate_ttft,
        rate_itl_rps=rate_itl,
        max_rate_rps=hi,
        min_rate_rps=lo,
        analysis=analyze_table(table, np.asarray(rate)),
    )


def replicas_for_slo(
    total_rate_rps: float,
    params: ServiceParams,
    server: ServerConfig,
    workload: Workload,
    ttft_ms: float | None = None,
    itl_ms: float | None = None,
    min_replicas: int = 1,
    max_replicas: int | None = None,
    *,
    options: ModelOptions = DEFAULT_MODEL,
    percentiles: Sequence[PercentileTarget] = (),
    first_token: FirstToken = FirstToken.AFTER_DECODE_ITERATION,
) -> ReplicaPlan:
    """Replicas needed so that total_rate_rps, split evenly, meets the targets. Spec §9.

    replicas = max(ceil(total / SLO capacity), min_replicas); above max_replicas the plan holds
    max_replicas and is infeasible."""
    total = require_non_negative("total_rate_rps", total_rate_rps)
    ttft_target = require_optional_target("ttft_ms", ttft_ms)
    itl_target = require_optional_target("itl_ms", itl_ms)
    low = require_int_at_least("min_replicas", min_replicas, 1)
    high = None if max_replicas is None else require_int_at_least("max_replicas", max_replicas, low)
    first = FirstToken(first_token)
    table = workload_table(params, server, workload, options=options)
    capacity = slo_capacity(table, ttft_target, itl_target, first)
    if percentiles:
        capacity = with_percentiles(
            capacity, params, server, workload, table, _targets(percentiles), first
        )
    return plan_replicas(table, capacity, total, low, high, first)


def plan_replicas(
    table: StateTable,
    capacity: SloCapacity,
    total_rate_rps: float,
    min_replicas: int,
    max_replicas: int | None,
    first_token: FirstToken = FirstToken.AFTER_DECODE_ITERATION,
) -> ReplicaPlan:
    """`replicas_for_slo` given a replica's SLO capacity (inputs already validated); the
    predicted TTFT in the `first_token` convention."""
    if not capacity.feasible:
        return ReplicaPlan(
            feasible=False,
            status=capacity.status,
            message=capacity.message,
            replicas=None,
            total_rate_rps=total_rate_rps,
            per_replica_rate_rps=None,
            ttft_ms=None,
            itl_ms=None,
            capacity=capacity,
        )
    needed = max(math.ceil(total_rate_rps / capacity.rate_rps - CEIL_SLACK), min_replicas)
    status = SizingStatus.OK
    if max_replicas is not None and needed > max_replicas:
        needed, status = max_replicas, SizingStatus.MAX_REPLICAS_EXCEEDED
    per_replica = total_rate_rps / needed
    at_count = analyze_table(table, np.asarray(per_replica))
    return ReplicaPlan(
        feasible=status is SizingStatus.OK,
        status=status,
        message=SIZING_MESSAGES[status],
        replicas=needed,
        total_rate_rps=total_rate_rps,
        per_replica_rate_rps=per_replica,
        ttft_ms=at_count.ttft_ms
        if first_token is FirstToken.AFTER_DECODE_ITERATION
        else at_count.ttft_with_last_chunk_ms,
        itl_ms=at_count.itl_ms,
        capacity=capacity,
    )
