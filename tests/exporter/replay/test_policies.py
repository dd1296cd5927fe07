"""What each policy proposes from a window it reads."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from exporter.config.values import DeploymentConfig, SloConfig, SourceConfig
from exporter.replay.perfect import WindowView, observe_window
from exporter.replay.policies import (
    FixedPolicy,
    OursPolicy,
    ReactiveMetric,
    ReactivePolicy,
)
from model.queueing.params import ServerConfig, ServiceParams
from model.simulation.simulator import Simulator
from model.simulation.workloads import RequestTrace


def _view() -> WindowView:
    sim = Simulator(ServiceParams(100.0, 1e-9, 1e-12), ServerConfig(4, 100), replicas=2,
                    kv_capacity_tokens=100, record_iterations=True)
    sim.add_requests(RequestTrace(np.array([0.1, 0.2]), np.array([10, 10]), np.array([3, 3])))
    start = sim.replica_status()
    sim.run(1.0)
    return observe_window(sim.result(), 0.0, 1.0, start, [sim.replica_status()],
                          records=[], kv_capacity_tokens=100)


def test_reactive_policy_sums_the_gauge_against_its_threshold() -> None:
    view = replace(_view(), waiting_requests=7, kv_usage_ratio=0.6)
    waiting = ReactivePolicy(ReactiveMetric.WAITING, 5.0).decide(view, 1.0, 2)
    assert (waiting.value, waiting.target) == (7.0, 5.0)
    kv = ReactivePolicy(ReactiveMetric.KV_CACHE, 0.8).decide(view, 1.0, 2)
    assert kv.value == 0.6 * 2 and kv.target == 0.8  # two pods at 60 %


def test_fixed_policy_ignores_the_window() -> None:
    assert FixedPolicy(4).decide(_view(), 1.0, 1).value == 4


def _ours() -> OursPolicy:
    dep = DeploymentConfig(name="sim", model_name="m", source=SourceConfig(scrape_urls=("http://x",)),
                           server=ServerConfig(256, 8192), slo=SloConfig(ttft_ms=50.0, itl_ms=20.0))
    return OursPolicy(dep, 1.0)


def test_ours_proposes_the_daemons_hand_over_count_while_uncalibrated() -> None:
    view = _view()
    # Requests in flight are not what the count is made of: the load is.
    view = replace(view, observation=replace(view.observation, requests_in_flight=130.0))
    policy = _ours()
    try:
        proposal = policy.decide(view, 1.0, 2)
        last = policy.cycle.recommender.last
    finally:
        policy.close()
    assert last is not None and last.reason.value == "handover"
    assert proposal.reason == "handover" and proposal.value == last.desired_replicas
    assert proposal.value < 3  # ceil(130 / 64) was the in-flight rule's count
