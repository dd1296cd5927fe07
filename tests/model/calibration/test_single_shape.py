"""The tuner on one request shape, as the closed loop observes a simulated replica: the wrong
states an unregularized fit showed on such traffic (a parameter at the numerical floor and a
flapping capacity, a seed never replaced, a bias dragged by two spikes, a saturated window
steering a cold fit, a restart under changed settings pinning the saved estimate)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from bench.lib.single_shape import saturation_rate_rps, simulate_windows, wandering_profile
from exporter.config.values import DeploymentConfig, SloConfig, SourceConfig, TunerConfig
from exporter.daemon.deployment_state import restore_state
from exporter.sizing.cycle import DeploymentCycle
from exporter.sizing.points import tuner_observation
from model import (
    Observation,
    ServerConfig,
    ServiceParams,
    SkipReason,
    Tuner,
    Workload,
    analyze,
)
from model.queueing.sizing import max_rate_for_slo
from tests.conftest import DATA_DIR
from tests.exporter.sizing.test_recommender import observation

TRUTH = ServiceParams(6.68, 2.01e-2, 5.52e-5)
SERVER = ServerConfig(max_batch_size=128)
SHAPE = (1024.0, 512.0)
WORKLOAD = Workload(*SHAPE)
ITL_SLO_MS = 20.0
WINDOWS = 40


@pytest.fixture(scope="module")
def points() -> list[Observation]:
    """Twenty minutes of 30 s windows of steady traffic: loads wandering over 0.45-0.55 of
    saturation."""
    rate = saturation_rate_rps(TRUTH, SERVER, *SHAPE)
    profile = wandering_profile(rate, WINDOWS * 30.0, np.random.default_rng(5), 0.45, 0.55)
    views = simulate_windows(TRUTH, SERVER, SHAPE, profile, WINDOWS * 30.0, seed=5)
    out = [tuner_observation(v.observation, SERVER.max_batch_size) for v in views]
    return [p for p in out if p is not None and not p.queue_growing]


def capacity(tuner: Tuner) -> float:
    """The per-replica rate meeting the ITL target, corrected for the tuner's ITL bias, as the
    recommender sizes."""
    assert tuner.params is not None
    bias = tuner.bias()
    factor = 1.0 if bias is None else 1.0 + bias[1]
    return max_rate_for_slo(tuner.params, SERVER, WORKLOAD, None, ITL_SLO_MS * factor).rate_rps


def corrected_latencies(tuner: Tuner, rate_rps: float) -> tuple[float, float]:
    """Bias-corrected TTFT and ITL (ms) the tuner predicts at a per-replica rate."""
    assert tuner.params is not None
    bias = tuner.bias() or (0.0, 0.0)
    at = analyze(tuner.params, SERVER, WORKLOAD, rate_rps)
    return float(at.ttft_ms) / (1 + bias[0]), float(at.itl_ms) / (1 + bias[1])


def test_cold_start_publishes_no_parameter_at_the_floor_and_a_steady_capacity(
    points: list[Observation],
) -> None:
    tuner = Tuner(SERVER)
    low, high = tuner.lower_bounds.as_tuple(), tuner.upper_bounds.as_tuple()
    caps = []
    for obs in points:
        tuner.update(obs)
        if tuner.params is not None:
            values = tuner.params.as_tuple()
            assert all(lo <= v <= hi for v, lo, hi in zip(values, low, high, strict=True)), values
            caps.append(capacity(tuner))
    assert len(caps) >= len(points) - 5
    change = np.abs(np.diff(caps)) / np.array(caps[:-1])
    assert np.percentile(change[5:], 90) < 0.05


def test_a_seed_two_times_off_is_replaced_by_the_data(points: list[Observation]) -> None:
    seed = ServiceParams(TRUTH.alpha_ms, 2 * TRUTH.beta_ms, 2 * TRUTH.gamma_ms)
    tuner = Tuner(SERVER, initial=seed)
    published = sum(tuner.update(obs).success for obs in points)
    assert published >= len(points) - 10
    assert tuner.params is not None and tuner.params != seed
    # The estimate predicts what the replica does: the last windows' mean latencies.
    for obs in points[-5:]:
        ttft, itl = corrected_latencies(tuner, obs.rate_rps)
        assert ttft == pytest.approx(obs.ttft_ms, rel=0.10)
        assert itl == pytest.approx(obs.itl_ms, rel=0.10)


def test_two_ttft_spikes_move_neither_the_bias_nor_the_prediction(
    points: list[Observation],
) -> None:
    tuner = Tuner(SERVER)
    for obs in points[:20]:
        tuner.update(obs)
    rate = points[19].rate_rps
    before_bias, before = tuner.bias(), corrected_latencies(tuner, rate)
    assert before_bias is not None
    for obs in points[20:22]:
        tuner.update(replace(obs, ttft_ms=10 * obs.ttft_ms))
    after_bias, after = tuner.bias(), corrected_latencies(tuner, rate)
    assert after_bias is not None and abs(after_bias[0] - before_bias[0]) < 0.05
    assert after[0] == pytest.approx(before[0], rel=0.05)
    assert after[1] == pytest.approx(before[1], rel=0.05)


def test_a_saturated_window_cannot_steer_a_cold_fit(points: list[Observation]) -> None:
    clean = Tuner(SERVER)
    for obs in points[:12]:
        clean.update(obs)
    # A window past saturation whose backlog test missed: its arrival rate above what the
    # replica completes, a queue in its TTFT. A cold fit can bend until it sits just under
    # saturation; it leaves the window instead.
    jammed = replace(
        points[2], rate_rps=1.3 * points[2].rate_rps, ttft_ms=3 * points[2].ttft_ms,
        itl_ms=1.3 * points[2].itl_ms,
    )  # fmt: skip
    steered = Tuner(SERVER)
    for obs in [*points[:2], jammed, *points[2:12]]:
        steered.update(obs)
    assert jammed not in steered.window and steered.skipped[SkipReason.SATURATED] == 1
    assert steered.params is not None
    assert capacity(steered) == pytest.approx(capacity(clean), rel=0.15)


def test_a_restart_under_changed_settings_recalibrates(points: list[Observation]) -> None:
    dep = DeploymentConfig(
        name="llama", model_name="llama", source=SourceConfig(scrape_urls=("http://x:1/",)),
        server=SERVER, slo=SloConfig(itl_ms=ITL_SLO_MS),
    )  # fmt: skip
    # The saved estimate is 2x off in beta and gamma; the restart comes with a wider window.
    saved = Tuner(SERVER, initial=ServiceParams(TRUTH.alpha_ms, 2 * TRUTH.beta_ms, 4e-4))
    state = {"deployments": {"llama": {"tuner": saved.to_dict(), "workload": list(SHAPE)}}}
    runtime = DeploymentCycle(replace(dep, tuner=TunerConfig(window=12)))
    restore_state(json.loads(json.dumps(state)), {"llama": runtime}, now_s=0.0)
    assert runtime.tuner.window_size == 12 and runtime.tuner.params == saved.params
    published = sum(runtime.tuner.update(obs).success for obs in points)
    assert published >= len(points) - 10
    ttft, itl = corrected_latencies(runtime.tuner, points[-1].rate_rps)
    assert itl == pytest.approx(points[-1].itl_ms, rel=0.10)


def test_a_state_file_from_before_the_prior_restores_its_estimate_as_the_centre(
    points: list[Observation],
) -> None:
    # Written by the tuner before the MAP fit (these windows, cold): a partial single-shape
    # estimate, no prior, no anchors.
    data = json.loads((DATA_DIR / "tuner-state-before-prior.json").read_text())
    assert "prior" not in data["config"] and "anchor" not in data and data["partial"]
    tuner = Tuner.from_dict(data)
    saved = ServiceParams.from_dict(data["params"])
    assert tuner.params == saved and tuner.current_prior().centre == saved
    assert tuner.identified == (False, False, False)
    published = sum(tuner.update(obs).success for obs in points)
    assert published >= len(points) - 10


def test_a_tuner_point_is_at_its_windows_arrival_rate() -> None:
    # Per pod, the arrivals alone. The mean of arrival and completion rates read a flatter ITL
    # curve on 5 s windows of steady 512 / 128 traffic (seeded at the truth, the published
    # capacity went to 2.3x the simulator's and the soak failed), so it is not used.
    window = replace(observation(3.0, 2), completion_rate_rps=1.0)
    point = tuner_observation(window, SERVER.max_batch_size)
    assert point is not None and point.rate_rps == pytest.approx(1.5)



def test_a_tuner_point_carries_its_occupancy_rate() -> None:
    # Little's law over what the pod held: (running + waiting) / lifetime, the lifetime
    # 45 ms + 511 x 12 ms = 6.177 s.
    window = replace(observation(3.0, 2), avg_running_per_pod=30.0, avg_waiting_per_pod=0.5)
    point = tuner_observation(window, SERVER.max_batch_size)
    assert point is not None and point.occupancy_rate_rps == pytest.approx(30.5 / 6.177)
    # Without the running requests read, there is none (the waiting alone are not the batch).
    unread = tuner_observation(replace(window, avg_running_per_pod=None), SERVER.max_batch_size)
    assert unread is not None and unread.occupancy_rate_rps is None
    with pytest.raises(ValueError, match="`occupancy_rate_rps` must be"):
        replace(point, occupancy_rate_rps=-1.0)
    assert Observation.from_dict(point.to_dict()) == point

def test_a_window_with_an_unobserved_pod_spans_every_pod_in_the_recent_rates() -> None:
    # 3 req/s over three pods, one of them not read (its share is the observed pods' scaled
    # up): 1 req/s per pod. Divided by the two observed pods alone it was 1.5, and the tuner
    # points whose rate spans this window read a load the batch never saw.
    dep = DeploymentConfig(
        name="llama", model_name="llama", source=SourceConfig(scrape_urls=("http://x:1/",)),
        server=SERVER, slo=SloConfig(itl_ms=ITL_SLO_MS),
    )  # fmt: skip
    runtime = DeploymentCycle(dep)
    runtime.rates.add(replace(observation(3.0, 2), unobserved_pods=1), 30.0)
    runtime.rates.add(observation(2.0, 2), 60.0)
    assert list(runtime.rates.per_pod()) == [
        pytest.approx((1.0, 30.0)), pytest.approx((1.0, 30.0))
    ]
