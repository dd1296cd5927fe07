"""The two-phase seam (exporter/sizing/cycle.py): observe a window into an estimate, decide over
every deployment's estimate; no I/O, counting or logging of its own."""

from __future__ import annotations

from dataclasses import replace

import pytest

from exporter.collector.pod_observation import Problem
from exporter.sizing.cycle import Constraints, DeploymentCycle, Sizer
from exporter.sizing.reasons import Reason
from tests.exporter.sizing.test_recommender import CAPACITY, LLAMA, deployment, observation


def test_a_window_read_becomes_an_estimate_and_a_decision() -> None:
    cycle = DeploymentCycle(deployment(initial_params=LLAMA))
    estimate = cycle.observe(observation(2.5 * CAPACITY, 3), 30.0)
    assert estimate.observation is not None and estimate.params == LLAMA
    assert estimate.workload is not None and estimate.inputs is not None
    decision = cycle.decide(estimate)
    assert decision is cycle.recommender.last and decision.desired_replicas == 3


def test_a_cycle_that_read_nothing_holds_the_last_count() -> None:
    cycle = DeploymentCycle(deployment(initial_params=LLAMA))
    cycle.decide(cycle.observe(observation(2.5 * CAPACITY, 3), 30.0))
    unread = cycle.observe(None, 60.0, demand=None)
    assert unread.observation is None and unread.workload is None
    assert unread.params == LLAMA  # the tuner's, for the record
    decision = cycle.decide(unread)
    assert decision.reason is Reason.SOURCE_DOWN and decision.desired_replicas == 3


def test_a_window_the_tuner_cannot_use_is_a_problem_for_the_caller_to_count() -> None:
    cycle = DeploymentCycle(deployment())
    # 2 s windows; a request lives 45 ms + 511 x 12 ms = 6.2 s, so a window's latencies were
    # made at the load of the windows before it too.
    cycle.observe(replace(observation(1.0, 1), window_s=2.0), 2.0)
    # Ten times the load of the window before: the latencies were not made at this rate.
    estimate = cycle.observe(replace(observation(10.0, 1), window_s=2.0), 4.0)
    assert estimate.problems == (Problem.NON_STATIONARY,)
    broken = cycle.observe(replace(observation(10.0, 1), avg_input_tokens=-5.0), 6.0)
    assert any("unusable request shape" in w for w in broken.warnings)


def test_one_deployment_whose_decision_raises_leaves_the_others_decided() -> None:
    sizer = Sizer([deployment(name="a", initial_params=LLAMA),
                   deployment(name="b", initial_params=LLAMA)])  # fmt: skip
    estimates = {name: sizer.observe(name, observation(CAPACITY, 2), 30.0) for name in "ab"}

    def boom(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("boom")

    sizer.cycles["a"].recommender.decide = boom  # type: ignore[method-assign]
    failed: list[str] = []
    decisions = sizer.decide(estimates, Constraints(), on_error=lambda n, _e: failed.append(n))
    assert list(decisions) == ["b"] and failed == ["a"]
    with pytest.raises(RuntimeError, match="boom"):  # without a guard, the error is the caller's
        sizer.decide(estimates)
