"""Every invalid model input raises ValueError naming the field and the value."""

from __future__ import annotations

import math

import numpy as np
import pytest

from model import (
    ServerConfig,
    ServiceParams,
    Workload,
    analyze,
    max_rate_for_slo,
    replicas_for_slo,
)

LLAMA = ServiceParams(6.68, 2.01e-2, 5.52e-5)
SERVER = ServerConfig()
SHAPE = Workload(1024, 512)


@pytest.mark.parametrize(
    ("build", "pattern"),
    [
        (lambda: ServiceParams(-1.0, 0.02, 5e-5), r"`alpha_ms`.*> 0, got -1.0"),
        (lambda: ServiceParams(6.0, math.nan, 5e-5), r"`beta_ms`.*got nan"),
        (lambda: ServiceParams(6.0, 0.02, 0.0), r"`gamma_ms`.*> 0, got 0.0"),
        (lambda: ServiceParams(6.0, 0.02, math.inf), r"`gamma_ms`.*got inf"),
        (lambda: ServiceParams("6", 0.02, 5e-5), r"`alpha_ms`.*got '6'"),
        (lambda: ServerConfig(max_batch_size=0), r"`max_batch_size`.*integer >= 1, got 0"),
        (lambda: ServerConfig(max_batch_size=2.5), r"`max_batch_size`.*got 2.5"),
        (lambda: ServerConfig(max_batch_size=True), r"`max_batch_size`.*got True"),
        (lambda: ServerConfig(max_num_batched_tokens=0), r"`max_num_batched_tokens`.*got 0"),
        (lambda: ServerConfig(max_queue_size=-1), r"`max_queue_size`.*>= 0, got -1"),
        (lambda: Workload(-5, 10), r"`avg_input_tokens`.*>= 0, got -5"),
        (lambda: Workload(100, 0.5), r"`avg_output_tokens`.*>= 1, got 0.5"),
        (lambda: Workload(100, math.nan), r"`avg_output_tokens`.*got nan"),
    ],
)
def test_value_types_reject_bad_fields(build, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        build()


@pytest.mark.parametrize(
    ("rate", "pattern"),
    [
        (-1.0, r"`rate_rps`.*>= 0, got -1.0"),
        (math.nan, r"`rate_rps`.*got nan"),
        (math.inf, r"`rate_rps`.*got inf"),
        (np.array([1.0, -2.0]), r"`rate_rps`.*got -2.0"),
        (np.ones((2, 2)), r"`rate_rps`.*1-D"),
        ("fast", r"`rate_rps` must be a number"),
    ],
)
def test_analyze_rejects_bad_rates(rate: object, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        analyze(LLAMA, SERVER, SHAPE, rate)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"ttft_ms": -5.0}, r"`ttft_ms`.*> 0, got -5.0"),
        ({"itl_ms": 0.0}, r"`itl_ms`.*> 0, got 0.0"),
        ({"itl_ms": math.nan}, r"`itl_ms`.*got nan"),
    ],
)
def test_sizing_rejects_bad_targets(kwargs: dict[str, float], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        max_rate_for_slo(LLAMA, SERVER, SHAPE, **kwargs)
    with pytest.raises(ValueError, match=pattern):
        replicas_for_slo(10.0, LLAMA, SERVER, SHAPE, **kwargs)


def test_replicas_rejects_bad_counts() -> None:
    with pytest.raises(ValueError, match=r"`total_rate_rps`.*got -3.0"):
        replicas_for_slo(-3.0, LLAMA, SERVER, SHAPE, ttft_ms=50)
    with pytest.raises(ValueError, match=r"`min_replicas`.*>= 1, got 0"):
        replicas_for_slo(3.0, LLAMA, SERVER, SHAPE, ttft_ms=50, min_replicas=0)
    with pytest.raises(ValueError, match=r"`max_replicas`.*>= 3, got 2"):
        replicas_for_slo(3.0, LLAMA, SERVER, SHAPE, ttft_ms=50, min_replicas=3, max_replicas=2)


def test_unstable_rate_is_a_result_not_an_error() -> None:
    result = analyze(LLAMA, SERVER, SHAPE, 20.0)
    assert result.stable is False
    assert math.isinf(result.ttft_ms) and math.isinf(result.itl_ms)
    assert result.throughput_rps == pytest.approx(result.saturation_rate_rps)


def test_finite_queue_is_stable_above_saturation() -> None:
    server = ServerConfig(max_queue_size=100)
    result = analyze(LLAMA, server, SHAPE, 20.0)
    assert result.stable is True
    assert result.throughput_rps < 20.0
    assert 0.0 < result.blocking_prob < 1.0


def test_infeasible_targets_say_so() -> None:
    capacity = max_rate_for_slo(LLAMA, SERVER, SHAPE, ttft_ms=10.0)
    assert not capacity.feasible and capacity.rate_rps == 0.0
    assert capacity.status == "ttft_infeasible" and capacity.binding == "ttft"
    plan = replicas_for_slo(50.0, LLAMA, SERVER, SHAPE, ttft_ms=10.0)
    assert not plan.feasible and plan.replicas is None and plan.ttft_ms is None


def test_max_replicas_cap_is_reported() -> None:
    plan = replicas_for_slo(100.0, LLAMA, SERVER, SHAPE, ttft_ms=50, itl_ms=25, max_replicas=4)
    assert plan.replicas == 4
    assert not plan.feasible and plan.status == "max_replicas_exceeded"


def test_no_targets_means_capacity_bound() -> None:
    capacity = max_rate_for_slo(LLAMA, SERVER, SHAPE)
    assert capacity.feasible and capacity.binding == "capacity"
    assert capacity.rate_rps == capacity.max_rate_rps


def test_zero_load_gets_min_replicas() -> None:
    plan = replicas_for_slo(0.0, LLAMA, SERVER, SHAPE, ttft_ms=50, min_replicas=2)
    assert plan.feasible and plan.replicas == 2
