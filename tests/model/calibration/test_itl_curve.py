"""The ITL curve: ITL alone against load at one request shape, over points that spread the
loads, each at its occupancy rate; and sizing reading ITL from it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from exporter.config.values import DeploymentConfig, SloConfig, SourceConfig
from exporter.sizing.forecast import forecast
from model import Observation, ServerConfig, ServiceParams, Tuner, Workload, analyze
from model.calibration.fit import fit
from model.calibration.itl_curve import (
    MIN_POINTS,
    NEWEST_KEPT,
    POINTS,
    fit_itl_curve,
    with_point,
)
from model.calibration.trust import ModelBias
from model.queueing.sizing import max_rate_for_slo
from model.queueing.variant import DEFAULT_MODEL

# The decode-heavy shape where the joint fit's ITL is furthest off: 128 / 2048, alpha 1.5x
# Table I's, an ITL target just above the empty engine's (capacity at 0.3 of saturation).
TRUTH = ServiceParams(10.02, 2.01e-2, 5.52e-5)
SERVER = ServerConfig(max_batch_size=256, max_num_batched_tokens=8192)
WORKLOAD = Workload(128, 2048)
ITL_SLO_MS = 13.0
SATURATION_RPS = float(analyze(TRUTH, SERVER, WORKLOAD, 1e-3).saturation_rate_rps)
CENTRE = ServiceParams(8.0, 1e-3, 6e-5)  # a joint fit's estimate there: alpha low, beta lost
BOUNDS = (ServiceParams(1e-3, 1e-7, 1e-12), ServiceParams(1e3, 10.0, 1.0))


def vllm_point(load: float, **fields: float) -> Observation:
    """The model's exact latencies at `load` x saturation, TTFT as vLLM reports it (the first
    token with the last prefill chunk: one decode iteration before the tuner's convention)."""
    rate = load * SATURATION_RPS
    at = analyze(TRUTH, SERVER, WORKLOAD, rate)
    values: dict[str, float] = {
        "rate_rps": rate,
        "avg_input_tokens": 128.0,
        "avg_output_tokens": 2048.0,
        "ttft_ms": float(at.ttft_with_last_chunk_ms),
        "itl_ms": float(at.itl_ms),
        **fields,
    }
    return Observation(**values)  # type: ignore[arg-type]


LOADS = (0.35, 0.5, 0.65, 0.8, 0.45, 0.6, 0.75, 0.4, 0.55, 0.7)


def true_capacity() -> float:
    return max_rate_for_slo(TRUTH, SERVER, WORKLOAD, None, ITL_SLO_MS).rate_rps


def dep_with(**slo: float) -> DeploymentConfig:
    return DeploymentConfig(
        name="d",
        model_name="m",
        source=SourceConfig(scrape_urls=("http://127.0.0.1:1/metrics",)),
        server=SERVER,
        slo=SloConfig(**slo),  # type: ignore[arg-type]
        rate_margin_sigmas=0.0,
    )


def published_capacity(tuner: Tuner) -> float:
    """The per-replica capacity the recommender sizes with, from the tuner's estimate and
    bias (the ITL curve among them)."""
    dep = dep_with(itl_ms=ITL_SLO_MS)
    assert tuner.params is not None
    out = forecast(dep, tuner.params, WORKLOAD, tuner.bias(), size_for_rps=1.0, per_replica_rps=1.0)
    return out.plan.capacity.rate_rps


def test_sizing_follows_the_measured_itl_where_the_joint_fit_trades_it_for_ttft() -> None:
    # Before the curve, ITL's load part was corrected by a factor read at these loads and
    # carried down to 0.3 of saturation: 22 % over the capacity.
    tuner = Tuner(SERVER, window_size=10)
    for k in range(20):
        tuner.update(vllm_point(LOADS[k % len(LOADS)], timestamp=30.0 * k))
    assert tuner.itl_curve is not None
    assert published_capacity(tuner) == pytest.approx(true_capacity(), rel=0.03)


def test_the_curve_is_fitted_to_itl_alone() -> None:
    points = [vllm_point(load) for load in LOADS]
    curve = fit_itl_curve(points, SERVER, DEFAULT_MODEL, CENTRE, BOUNDS)
    assert curve is not None
    # TTFT ten times off changes nothing: it is not in the loss.
    wrong_ttft = [replace(p, ttft_ms=10 * p.ttft_ms) for p in points]
    again = fit_itl_curve(wrong_ttft, SERVER, DEFAULT_MODEL, CENTRE, BOUNDS)
    assert again == curve
    low = 0.3 * SATURATION_RPS
    assert float(analyze(curve, SERVER, WORKLOAD, low).itl_ms) == pytest.approx(
        float(analyze(TRUTH, SERVER, WORKLOAD, low).itl_ms), rel=0.005
    )


def itl_at(params: ServiceParams, load: float) -> float:
    return float(analyze(params, SERVER, WORKLOAD, load * SATURATION_RPS).itl_ms)


def test_points_that_spread_the_loads_stay_and_the_newest_always() -> None:
    rng = np.random.default_rng(3)
    spread = [vllm_point(load) for load in (0.3, 0.8)]
    kept: list[Observation] = spread
    # A long steady stretch at one load: its points crowd each other out, not the spread ones.
    for _ in range(3 * POINTS):
        kept = with_point(kept, vllm_point(0.5 * float(np.exp(rng.normal(0, 0.01)))))
    assert len(kept) == POINTS
    assert all(p in kept for p in spread)
    newest = [vllm_point(0.5), vllm_point(0.5), vllm_point(0.5)]
    for p in newest:
        kept = with_point(kept, p)
    assert kept[-NEWEST_KEPT:] == newest


def test_no_curve_from_few_points_or_one_load() -> None:
    few = [vllm_point(load) for load in LOADS[: MIN_POINTS - 1]]
    assert fit_itl_curve(few, SERVER, DEFAULT_MODEL, CENTRE, BOUNDS) is None
    one_load = [vllm_point(0.5 + 0.005 * k) for k in range(POINTS)]
    assert fit_itl_curve(one_load, SERVER, DEFAULT_MODEL, CENTRE, BOUNDS) is None


def test_each_point_sits_at_its_occupancy_rate() -> None:
    # Windows read at a noisy arrival rate (the count of a 30 s window) but with the batch
    # the engine held: the noise in the rate flattens a slope fitted against it.
    rng = np.random.default_rng(11)
    exact = [vllm_point(load) for load in LOADS * 2]
    noisy = [
        replace(
            p, rate_rps=p.rate_rps * float(np.exp(rng.normal(0, 0.15))), occupancy_rate_rps=None
        )
        for p in exact
    ]
    occupied = [
        replace(p, occupancy_rate_rps=q.rate_rps) for p, q in zip(noisy, exact, strict=True)
    ]
    by_rate = fit_itl_curve(noisy, SERVER, DEFAULT_MODEL, CENTRE, BOUNDS)
    by_occupancy = fit_itl_curve(occupied, SERVER, DEFAULT_MODEL, CENTRE, BOUNDS)
    assert by_rate is not None and by_occupancy is not None
    truth = itl_at(TRUTH, 0.3)
    assert itl_at(by_occupancy, 0.3) == pytest.approx(truth, rel=0.005)
    assert abs(itl_at(by_rate, 0.3) / truth - 1) > 0.01


def test_an_itl_spike_is_left_out_of_the_curve() -> None:
    points = [vllm_point(load) for load in LOADS]
    points[4] = replace(points[4], itl_ms=10 * points[4].itl_ms)
    curve = fit_itl_curve(points, SERVER, DEFAULT_MODEL, CENTRE, BOUNDS)
    assert curve is not None
    assert itl_at(curve, 0.3) == pytest.approx(itl_at(TRUTH, 0.3), rel=0.005)


def test_a_curve_outside_the_bounds_is_not_used() -> None:
    points = [vllm_point(load) for load in LOADS]
    tight = (BOUNDS[0], ServiceParams(5.0, 10.0, 1.0))  # alpha at most 5 ms: the truth is 10
    assert fit_itl_curve(points, SERVER, DEFAULT_MODEL, CENTRE, tight) is None


def test_the_curve_starts_over_after_a_change_and_survives_a_restart() -> None:
    tuner = Tuner(SERVER, window_size=10)
    for k in range(20):
        tuner.update(vllm_point(LOADS[k % len(LOADS)], timestamp=30.0 * k))
    before = tuner.itl_curve
    assert before is not None
    restored = Tuner.from_dict(tuner.to_dict()).itl_curve
    assert restored is not None
    assert itl_at(restored, 0.3) == pytest.approx(itl_at(before, 0.3), rel=1e-3)
    # A state saved before the curve existed starts it from the window.
    old = tuner.to_dict()
    del old["itl_curve"]
    assert Tuner.from_dict(old).itl_curve is not None
    # ITL 30 % up at every load: the change watch cuts the window, the curve starts over with
    # it and sizing corrects the estimate until MIN_POINTS points have come.
    slower = [replace(vllm_point(load), itl_ms=1.3 * itl_at(TRUTH, load)) for load in LOADS]
    seen = []
    for k, point in enumerate(slower):
        tuner.update(replace(point, timestamp=30.0 * (20 + k)))
        seen.append(tuner.itl_curve)
    assert None in seen
    after = tuner.itl_curve
    assert after is not None and itl_at(after, 0.3) == pytest.approx(
        1.3 * itl_at(TRUTH, 0.3), rel=0.02
    )


def test_sizing_takes_the_tighter_of_the_estimates_ttft_plan_and_the_curves_itl_plan() -> None:
    estimate = ServiceParams(8.0, 1e-3, 6e-5)
    bias = ModelBias(0.0, -0.2, -0.4, TRUTH)
    rate = 0.3 * SATURATION_RPS
    out = forecast(
        dep_with(itl_ms=ITL_SLO_MS),
        estimate,
        WORKLOAD,
        bias,
        size_for_rps=rate,
        per_replica_rps=rate,
    )
    # ITL is the curve's, uncorrected by the estimate's bias.
    assert out.itl_ms == pytest.approx(itl_at(TRUTH, 0.3))
    assert out.plan.capacity.rate_rps == pytest.approx(true_capacity(), rel=1e-6)
    # A TTFT target the estimate puts below the curve's ITL capacity binds instead.
    ttft_cap = 0.2 * SATURATION_RPS
    ttft_target = float(analyze(estimate, SERVER, WORKLOAD, ttft_cap).ttft_ms)
    both = forecast(
        dep_with(itl_ms=ITL_SLO_MS, ttft_ms=ttft_target), estimate, WORKLOAD, bias,
        size_for_rps=rate, per_replica_rps=rate,
    )  # fmt: skip
    assert both.plan.capacity.rate_rps == pytest.approx(ttft_cap, rel=0.01)
    assert both.ttft_ms == pytest.approx(float(analyze(estimate, SERVER, WORKLOAD, rate).ttft_ms))


def test_an_itl_only_fit_leaves_ttft_out_of_the_residuals() -> None:
    points = [vllm_point(load) for load in LOADS]
    joint = fit(points, SERVER, CENTRE)
    alone = fit(points, SERVER, CENTRE, itl_only=True)
    assert joint.params != alone.params
    # The loss counts ITL alone; the result still reports both metrics' errors.
    assert alone.loss == pytest.approx(float(np.sum(alone.residuals[:, 1] ** 2)))
    assert alone.residuals.shape == (len(points), 2)
