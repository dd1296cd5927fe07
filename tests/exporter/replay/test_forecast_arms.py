"""Forecaster arms: variants of ours that differ only in the look-ahead's forecaster, each
started from the history read before the replay and sized through it on the replay."""

from __future__ import annotations

import numpy as np

from exporter.config.loader import parse_config
from exporter.config.values import ForecastMode
from exporter.replay.arrivals import DrawnArrivals
from exporter.replay.engine import Engine
from exporter.replay.forecast_arms import arm_name, forecast_arms
from exporter.replay.policies import OursPolicy
from exporter.replay.session import fleet_settings
from exporter.replay.settings import parse_replay
from exporter.sizing.forecasters import ForecasterName
from model.queueing.params import ServiceParams
from model.simulation.workloads import RequestTrace

TRUTH = ServiceParams(6.68, 0.0201, 5.52e-5)


def _settings():  # type: ignore[no-untyped-def]
    config = parse_config({"cycle_period_s": 30, "deployments": [{
        "name": "llama", "model_name": "m", "source": {"scrape_urls": ["http://vllm:8000/m"]},
        "slo": {"ttft_ms": 200, "itl_ms": 50}, "replicas": {"min": 1, "max": 8},
        "look_ahead_s": 90, "initial_params": TRUTH.to_dict(),
    }]})  # fmt: skip
    return parse_replay({"startup_delay_s": 90, "initial_replicas": 1}, config.deployments[0], 30)


def test_each_arm_sizes_with_its_own_forecaster_from_the_history_given() -> None:
    history = [(-30.0 * k, 5.0) for k in range(50, 0, -1)]
    arms = forecast_arms(_settings(), tuple(ForecastMode), history=history)
    assert [a.policy.name for a in arms] == [arm_name(m) for m in ForecastMode]
    for arm, mode in zip(arms, ForecastMode, strict=True):
        assert isinstance(arm.policy, OursPolicy)
        strategy = arm.policy.cycle.forecaster
        assert strategy.mode is mode and strategy.horizon_s == 90.0
        assert len(strategy.history.recent) == 40  # the history was fed
    rng = np.random.default_rng(0)
    times = np.sort(rng.uniform(0.0, 600.0, 3000))  # 5 req/s for 10 minutes
    trace = RequestTrace(times, np.full(times.size, 512), np.full(times.size, 64))
    engine = Engine(fleet_settings(_settings(), TRUTH), arms)
    for _ in engine.steps(DrawnArrivals(trace)):
        pass
    for arm in arms:
        strategy = arm.policy.cycle.forecaster  # type: ignore[attr-defined]
        # Every window but the first (its counters are the first sample); the history fed
        # the backtest but is not counted.
        assert sum(strategy.choices.values()) == 19
    fixed = arms[[m for m in ForecastMode].index(ForecastMode.KALMAN)]
    assert set(fixed.policy.cycle.forecaster.choices) == {ForecasterName.KALMAN}  # type: ignore[attr-defined]
