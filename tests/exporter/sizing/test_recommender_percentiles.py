"""The recommender on percentile targets: sized through the model's percentile search without
the mean bias factor, the binding target named, and the targets' percentiles predicted at the
current load."""

from __future__ import annotations

import math

import numpy as np
import pytest

from exporter.config.values import SloConfig
from exporter.sizing.reasons import Reason
from exporter.sizing.recommender import Recommender
from exporter.sizing.slo_targets import BindingTarget, binding_target
from model import (
    DEFAULT_MODEL,
    FirstToken,
    LatencyMetric,
    PercentileTarget,
    latency_quantiles,
    max_rate_for_slo,
    replicas_for_slo,
)
from model.queueing.chain import workload_table
from model.queueing.percentile_sizing import attainment_at
from tests.exporter.sizing.test_recommender import LLAMA, SERVER, SHAPE, deployment, observation

TTFT_P95 = PercentileTarget(LatencyMetric.TTFT, 0.95, 200.0)
ITL_P99 = PercentileTarget(LatencyMetric.ITL_PER_TOKEN, 0.99, 40.0)
PERCENTILES = SloConfig(percentiles=(TTFT_P95, ITL_P99))
# Percentile sizing runs the default (refined) variant, as a deployment does unless told.
CAPACITY = max_rate_for_slo(LLAMA, SERVER, SHAPE, percentiles=(TTFT_P95, ITL_P99))


def test_capacity_and_count_come_from_the_percentile_search() -> None:
    assert CAPACITY.feasible and CAPACITY.binding_target is not None
    rate = 3.4 * CAPACITY.rate_rps
    dep = deployment(slo=PERCENTILES, model=DEFAULT_MODEL)
    decision = Recommender(dep).decide(0.0, observation(rate, 2), LLAMA, SHAPE)
    expected = replicas_for_slo(rate, LLAMA, SERVER, SHAPE, percentiles=PERCENTILES.percentiles)
    assert decision.model_replicas == expected.replicas == 4
    assert decision.max_rate_per_replica_rps == pytest.approx(CAPACITY.rate_rps)
    assert decision.binding_target is binding_target(CAPACITY)
    assert decision.binding_target in (
        BindingTarget.TTFT_PERCENTILE,
        BindingTarget.ITL_PER_TOKEN_PERCENTILE,
    )


@pytest.mark.parametrize("bias", [(0.2, 0.0), (0.2, 0.3), (-0.4, -0.2)])
def test_the_mean_bias_leaves_percentile_sizing_unchanged(bias: tuple[float, float]) -> None:
    rate = 3.4 * CAPACITY.rate_rps
    dep = deployment(slo=PERCENTILES, model=DEFAULT_MODEL)
    plain = Recommender(dep).decide(0.0, observation(rate, 2), LLAMA, SHAPE)
    biased = Recommender(dep).decide(0.0, observation(rate, 2), LLAMA, SHAPE, bias=bias)
    assert biased.max_rate_per_replica_rps == plain.max_rate_per_replica_rps
    assert biased.model_replicas == plain.model_replicas
    assert biased.predicted_percentiles == plain.predicted_percentiles


def test_the_mean_bias_still_tightens_a_mean_target_beside_percentiles() -> None:
    # A model 20 % optimistic on mean TTFT: the mean target is sized at 50 x 0.8 ms.
    mean_rate = max_rate_for_slo(LLAMA, SERVER, SHAPE, ttft_ms=50.0).rate_rps
    assert mean_rate < CAPACITY.rate_rps  # the mean target binds even unbiased
    slo = SloConfig(ttft_ms=50.0, percentiles=PERCENTILES.percentiles)
    dep = deployment(slo=slo, model=DEFAULT_MODEL)
    plain = Recommender(dep).decide(0.0, observation(10.0, 2), LLAMA, SHAPE)
    biased = Recommender(dep).decide(0.0, observation(10.0, 2), LLAMA, SHAPE, bias=(-0.2, 0.0))
    assert plain.binding_target is biased.binding_target is BindingTarget.TTFT_MEAN
    assert plain.max_rate_per_replica_rps == pytest.approx(mean_rate)
    assert biased.max_rate_per_replica_rps is not None and plain.max_rate_per_replica_rps
    tightened = max_rate_for_slo(LLAMA, SERVER, SHAPE, ttft_ms=40.0).rate_rps
    assert biased.max_rate_per_replica_rps == pytest.approx(tightened)
    assert tightened < mean_rate


def test_percentiles_are_predicted_at_the_current_load_on_the_current_replicas() -> None:
    dep = deployment(slo=PERCENTILES, model=DEFAULT_MODEL)
    decision = Recommender(dep).decide(0.0, observation(12.0, 3), LLAMA, SHAPE, bias=(0.3, 0.1))
    expected = latency_quantiles(LLAMA, SERVER, SHAPE, 4.0, [0.95, 0.99])
    ttft, itl = decision.predicted_percentiles
    assert (ttft.target, itl.target) == (TTFT_P95, ITL_P99)
    assert ttft.value_ms == pytest.approx(float(expected.ttft_ms[0]))
    assert itl.value_ms == pytest.approx(float(expected.itl_per_token_ms[1]))
    table = workload_table(LLAMA, SERVER, SHAPE, options=DEFAULT_MODEL)
    shares = attainment_at(
        LLAMA, SERVER, SHAPE, table, (TTFT_P95, ITL_P99), FirstToken.AFTER_DECODE_ITERATION, 4.0
    )
    assert (ttft.attainment, itl.attainment) == pytest.approx(shares)
    # Attainment and percentile are two readings of one distribution.
    assert (ttft.attainment >= 0.95) == (ttft.value_ms <= TTFT_P95.target_ms)


def test_saturating_load_predicts_infinite_percentiles() -> None:
    dep = deployment(slo=PERCENTILES, model=DEFAULT_MODEL)
    decision = Recommender(dep).decide(0.0, observation(500.0, 1), LLAMA, SHAPE)
    assert all(math.isinf(p.value_ms) for p in decision.predicted_percentiles)


def test_without_percentile_targets_nothing_is_predicted() -> None:
    decision = Recommender(deployment()).decide(0.0, observation(5.0, 2), LLAMA, SHAPE)
    assert decision.predicted_percentiles == ()
    assert decision.binding_target in (BindingTarget.TTFT_MEAN, BindingTarget.ITL_MEAN)


def test_an_unattainable_percentile_is_named_as_binding() -> None:
    tight = PercentileTarget(LatencyMetric.ITL_PER_REQUEST, 0.99, 1.0)
    dep = deployment(slo=SloConfig(percentiles=(tight,)), model=DEFAULT_MODEL)
    decision = Recommender(dep).decide(0.0, observation(5.0, 2), LLAMA, SHAPE)
    assert decision.binding_target is BindingTarget.ITL_PER_REQUEST_PERCENTILE
    assert decision.model_replicas is None and decision.desired_replicas == 6
    assert np.isfinite(decision.predicted_percentiles[0].value_ms)


def test_a_five_point_attainment_shortfall_raises_the_count() -> None:
    dep = deployment(slo=SloConfig(percentiles=(TTFT_P95,)), model=DEFAULT_MODEL)
    capacity = max_rate_for_slo(LLAMA, SERVER, SHAPE, percentiles=(TTFT_P95,))
    rate = 2.9 * capacity.rate_rps
    plain = Recommender(dep).decide(0.0, observation(rate, 3), LLAMA, SHAPE)
    short = Recommender(dep).decide(
        0.0, observation(rate, 3), LLAMA, SHAPE, shortfalls={TTFT_P95: 0.05}
    )
    tight = PercentileTarget(LatencyMetric.TTFT, 0.999, TTFT_P95.target_ms)  # 0.95 + 0.05, capped
    expected = replicas_for_slo(rate, LLAMA, SERVER, SHAPE, percentiles=(tight,))
    assert plain.model_replicas == 3
    assert short.model_replicas == expected.replicas
    assert short.model_replicas is not None and short.model_replicas > plain.model_replicas
    assert short.reason is Reason.TAIL_SHORTFALL and plain.reason is Reason.AT_TARGET
    # What is predicted and exported stays the configured target's.
    assert short.predicted_percentiles == plain.predicted_percentiles
